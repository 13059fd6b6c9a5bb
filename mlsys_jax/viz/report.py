"""``mlsys-jax run all --report DIR``: DIR/report.md with every table, each lecture figure beside
ours with a verdict, and PNG plots when matplotlib is installed."""
from __future__ import annotations

import math
import os
import time
from typing import Any

from mlsys_jax.results import Check
from mlsys_jax.tables import markdown_table
from mlsys_jax.viz import plots

SAME_REL = 0.01  # a figure within 1 % of the lecture's is the same figure


def _same(ours: Any, lecture: Any) -> bool:
    if isinstance(ours, bool) or isinstance(lecture, bool):
        return ours == lecture
    if isinstance(ours, (int, float)) and isinstance(lecture, (int, float)):
        if lecture == 0 or not math.isfinite(lecture):
            return ours == lecture or abs(ours) < 1e-12
        return abs(ours - lecture) <= SAME_REL * abs(lecture)
    if isinstance(ours, (list, tuple)) and isinstance(lecture, (list, tuple)):
        return len(ours) == len(lecture) and all(_same(a, b) for a, b in zip(ours, lecture))
    return str(ours) == str(lecture)


ROUNDING = 1e-9  # figures below this are float rounding noise, whatever their exact value


def _number(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def verdict(check: Check) -> str:
    """✓ matched, ✗ failed, or "differs in value, not in kind" with the reason.

    A lecture entry that is a phrase ("> 1", "one fused kernel") is the criterion itself: a
    check that holds matches it. A lecture *figure* that ours does not match needs a reason: the
    check's note, or float rounding when both figures are at that level.
    """
    if not check.ok:
        return "✗"
    lecture = check.lecture
    if lecture is None or isinstance(lecture, str) or _same(check.ours, lecture):
        return "✓"
    ours, lec = _number(check.ours), _number(lecture)
    if check.note:
        return f"✓ differs in value, not in kind: {check.note}"
    if ours is not None and lec is not None and abs(ours) < ROUNDING and abs(lec) < ROUNDING:
        return "✓ differs in value, not in kind: both are float rounding noise"
    return "✓ differs in value, not in kind (no reason recorded)"


def write_report(directory: str, outputs: list[tuple], split: dict[str, float]) -> str:
    """Write ``directory/report.md`` (+ PNGs); ``outputs`` holds (module, Result, checks) triples.

    Each experiment module draws its own pictures from its result: ``module.plots(result,
    directory)`` returns the paths of the PNGs it wrote.
    """
    os.makedirs(directory, exist_ok=True)
    lines = ["# mlsys-jax: the lecture, reproduced", "",
             f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `mlsys-jax run all --report {directory}`.",
             "", "| experiment | title | seconds | claims | failed |", "|---|---|---|---|---|"]
    for _, result, checks in outputs:
        bad = sum(not c.ok for c in checks)
        lines.append(f"| {result.id} | {result.title} | {split.get(result.id, '')} | {len(checks)} | {bad} |")
    lines.append(f"| **all** | | **{round(sum(split.values()), 1)}** | | |")
    plot_note = plots.unavailable_reason()
    for module, result, checks in outputs:
        lines += ["", f"## {result.id} · {result.title}", ""]
        if checks:
            lines += ["### Lecture figures vs ours", "",
                      markdown_table([{"claim": c.claim, "lecture": c.lecture, "ours": c.ours,
                                      "verdict": verdict(c)} for c in checks]), ""]
        for name, rows in result.tables.items():
            lines += [f"### {name}", "", markdown_table(rows), ""]
        if result.notes:
            lines += ["### Notes", ""] + [f"- {n}" for n in result.notes] + [""]
        if plot_note is None:
            for path in module.plots(result, directory):
                lines += [f"![{os.path.basename(path)}]({os.path.basename(path)})", ""]
    if plot_note:
        lines += ["", f"_{plot_note}_"]
    path = os.path.join(directory, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path
