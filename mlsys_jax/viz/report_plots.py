"""The report's pictures, drawn from each experiment's returned data (never re-measured).

One function per experiment id; each returns the PNG paths it wrote. matplotlib is optional.
"""
from __future__ import annotations

import os

from mlsys_jax.viz import plots


def unavailable() -> str | None:
    """None when PNGs can be drawn, else the reason (shown in the report)."""
    return plots.unavailable_reason()


def _graph_opt(result, directory):
    d = result.data
    steps = {row["step"]: ks for row, ks in zip(d["steps"], d["step_kernels"])}
    r = d["roofline"]
    return [plots.roofline_steps(os.path.join(directory, "02_roofline_steps.png"), steps,
                                 peak_flops=r["peak_flops"], bandwidth=r["bandwidth"],
                                 title=f"§4.2 rewrite steps on the {r['hw']} roofline model "
                                       f"({r['dtype']})")]


def _remat(result, directory):
    from experiments.s03_remat import write_plots

    return write_plots(directory, result.tables)


def _pipeline(result, directory):
    from mlsys_jax.parallel.pipeline import make_schedule

    p, m = 4, 8  # the in-flight example of §5.3 / JAX_NOTES: GPipe vs 1F1B side by side
    grids = {}
    for name in ("gpipe", "1f1b"):
        sched = make_schedule(name, p, m)
        grids[f"{name}: P={p}, M={m}, bubble {float(sched.bubble_fraction()):.1%}, "
              f"peak in flight {list(sched.in_flight_peaks())}"] = [
            [None if c is None else str(c) for c in row] for row in sched.table]
    return [plots.schedule_grid(os.path.join(directory, "04_pipeline_timeline.png"), grids,
                                title="Pipeline schedules as data (§5.3)")]


def _dispatch(result, directory):
    from experiments._s05_parts import write_plots

    return write_plots(directory, result.tables, result.data)


PLOTTERS = {"02": _graph_opt, "03": _remat, "04": _pipeline, "05": _dispatch}


def plot(result, directory: str) -> list[str]:
    fn = PLOTTERS.get(result.id)
    return [p for p in (fn(result, directory) if fn else []) if p]
