"""The run-all report: verdicts beside the lecture's figures, markdown tables, PNGs."""
import types

import pytest

from mlsys_jax.results import Check, Result, resolve_overrides, OverrideError
from mlsys_jax.viz import plots, report


@pytest.mark.parametrize("check, want", [
    (Check("holds, same figure", True, 73.87, 73.9), "✓"),
    (Check("fails", False, 1, 2), "✗"),
    (Check("criterion", True, 1.4, "> 1"), "✓"),
    (Check("rounding", True, 1.1e-16, 5.6e-17), "≈ differs in value, not in kind: both are float rounding noise"),
    (Check("explained", True, 13.5, 22.7, note="other random weights"),
     "≈ differs in value, not in kind: other random weights"),
    (Check("unexplained", True, 13.5, 22.7), "≈ differs in value, not in kind: no reason recorded"),
    (Check("lists", True, [6, 4, 2], (6, 4, 2)), "✓"),
])
def test_verdicts(check, want):
    assert report.verdict(check) == want


def test_markdown_report_with_tables_checks_and_plots(tmp_path):
    result = Result("04", "Parallelism", {"bubble": [{"P": 2, "M": 4, "bubble": 0.2}]}, ["a note"])
    checks = [Check("bubble 20%", True, 0.2, 0.2), Check("broken claim", False, 3, 2)]
    asked = []

    def draw(res, directory):  # the experiment module draws its own pictures from its result
        asked.append((res, directory))
        return [str(tmp_path / "04_bubble.png")]
    module = types.SimpleNamespace(plots=draw)
    path = report.write_report(str(tmp_path), [(module, result, checks)], {"04": 1.5})
    text = open(path).read()
    assert "| 04 | Parallelism | 1.5 | 2 | 1 |" in text
    assert "| bubble 20% | 0.2 | 0.2 | ✓ |" in text and "| broken claim | 2 | 3 | ✗ |" in text
    assert "| P | M | bubble |" in text and "- a note" in text
    if plots.unavailable_reason() is None:
        assert asked == [(result, str(tmp_path))]
        assert "![04_bubble.png](04_bubble.png)" in text
    else:  # without matplotlib no module is asked, and the report says why
        assert asked == [] and plots.unavailable_reason() in text


def test_overrides_are_coerced_and_unknown_keys_refused():
    defaults = {"n": 64, "ks": (1, 2), "plots": "", "exact": True, "lr": 0.1}
    got = resolve_overrides("03", defaults, {"n": "100", "ks": "4,8", "exact": "off", "lr": "0.5"})
    assert got == {"n": 100, "ks": (4, 8), "plots": "", "exact": False, "lr": 0.5}
    with pytest.raises(OverrideError, match="unknown setting"):
        resolve_overrides("03", defaults, {"k": "1"})
    with pytest.raises(OverrideError, match="not a valid int"):
        resolve_overrides("03", defaults, {"n": "many"})


def test_the_terminal_marks_a_differing_figure_with_its_reason_and_run_all_ends_with_a_summary():
    from mlsys_jax.results import format_result, format_summary

    result = Result("04", "Parallelism", {})
    checks = [Check("bubble 20%", True, 0.2, 0.2),
              Check("speedup", True, 13.5, 22.7, note="other random weights"),
              Check("broken", False, 3, 2)]
    text = format_result(result, checks)
    rows = {line.split("|")[0].strip(): line for line in text.splitlines() if "|" in line}
    assert "✓" in rows["bubble 20%"] and "≈" in rows["speedup"] and "✗" in rows["broken"]
    assert "other random weights" in rows["speedup"] and "✓" not in rows["speedup"]
    summary = format_summary([(None, result, checks)], {"04": 1.5}).splitlines()
    head = " ".join(summary[:2])
    assert "3 lecture claims: 2 hold (1 ✓ on the lecture's figure, 1 ≈" in head
    assert "1 ✗ failed" in head
    assert any(ln.strip().startswith("≈ 04: speedup: ours 13.5, lecture 22.7 — other random")
               for ln in summary)
    assert any(ln.strip().startswith("✗ 04: broken") for ln in summary)
