"""BENCHMARKS.md: every kind of figure a benchmark returns becomes one readable cell."""
from benchmarks.runner import discover, markdown, merged

REPORT = {
    "machine": {"time": "t", "cpu": "cpu", "cores": 2, "python": "3", "jax": "0", "platform": "cpu",
                "device_kind": "cpu", "devices": 8},
    "seconds": 1.0,
    "benchmarks": {"demo": {"seconds": 0.5, "notes": ["a note"], "figures": {
        "plain_ratio": 1.5,
        "paired_ratio": {"ratio": 1.2, "min": 1.1, "max": 1.3},
        "percentile_ratio": {"ratio": 1.15, "p10": 0.99, "p90": 1.36},
        "timings_us": {"eager": {"median_us": 10.0, "min_us": 9.0, "max_us": 12.0, "repeats": 5,
                                 "number": 7},
                       "warm": {"median_us": 2.0, "p10_us": 1.5, "p90_us": 3.0, "rounds": 9}},
    }}},
}


def test_every_figure_kind_is_one_cell():
    md = markdown(REPORT, list(discover()))
    assert "| plain_ratio | 1.5 |" in md
    assert "| paired_ratio | 1.2 [1.1–1.3] |" in md
    assert "| percentile_ratio | 1.15 [p10–p90: 0.99–1.36] |" in md
    assert "| timings_us.eager | 10 µs [9–12] |" in md
    assert "| timings_us.warm | 2 µs [p10–p90: 1.5–3] |" in md
    assert "- a note" in md
    assert not any(row.startswith(("| timings_us.eager.", "| timings_us.warm.")) for row in
                   md.splitlines())  # repeats, number and rounds are folded into their cell


def test_one_benchmarks_markdown_replaces_its_own_section_only():
    old = markdown({**REPORT, "benchmarks": {"demo": {"seconds": 9, "figures": {"old_ratio": 2}},
                                             "other": {"seconds": 1, "figures": {"kept": 3}}}},
                   ["demo", "other"])
    new = merged(old, REPORT)
    assert new.startswith(old.split("## ")[0])  # the heading of the whole run, as it was
    assert "| kept | 3 |" in new and "| old_ratio |" not in new and "| plain_ratio | 1.5 |" in new
    assert new.count("## demo") == 1 and "This section alone: `mlsys-jax bench demo --json`" in new
    added = merged(old, {**REPORT, "benchmarks": {"fresh": REPORT["benchmarks"]["demo"]}})
    assert "## fresh" in added and "| old_ratio | 2 |" in added
