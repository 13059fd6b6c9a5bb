"""``mlsys-jax run all --report DIR``: DIR/report.md with every table, each lecture figure beside
ours with a verdict, and PNG plots when matplotlib is installed."""
from __future__ import annotations

import os
import time

from mlsys_jax.results import Check, mark
from mlsys_jax.tables import markdown_table
from mlsys_jax.viz import plots

def verdict(check: Check) -> str:
    """The report's verdict cell: ✓, ✗, or ≈ with why ours differs from the lecture's figure
    (:func:`mlsys_jax.results.mark`, the rule the terminal follows too)."""
    symbol, why = mark(check)
    return f"≈ differs in value, not in kind: {why}" if symbol == "≈" else symbol


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
