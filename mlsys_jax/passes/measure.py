"""Timing candidate graphs on this machine, for a search that never loses where it runs.

TASO measures its operators on the device; a cost model alone can be wrong about a machine (XLA:CPU
fuses BatchNorm into the conv's consumer loop, so folding it saves nothing there, lecture §4.2).
Each graph is compiled with ``jax.jit`` and run on the same seeded random inputs, side by side in
interleaved rounds (``mlsys_jax.timing``): the medians decide, with min–max for the spread.
"""
from __future__ import annotations

from functools import partial

import jax

from mlsys_jax import ir, timing

ROUND_S = 0.02  # each round runs a graph for ≥ 20 ms: a few ms of another process's load averages out


def fastest(graphs: list, repeats: int = 7, seed: int = 0) -> dict:
    """Time ``graphs`` (ClosedJaxprs of one signature; the first is the reference) side by side.

    Returns ``{"candidates": [{"median_us", "min_us", "max_us", "repeats", "number"}, ...],
    "picked": index of the lowest median, "speedup": reference / picked (paired per round),
    "speedup_min", "speedup_max", "rounds"}``.
    """
    args = ir.random_inputs(ir.input_structs(graphs[0]), seed=seed)
    fns = {str(i): partial(jax.jit(ir.as_function(g)), *args) for i, g in enumerate(graphs)}
    times = timing.compare(fns, repeats=repeats, min_time_s=ROUND_S)
    rows = [times[str(i)] for i in range(len(graphs))]
    picked = min(range(len(rows)), key=lambda i: rows[i].median_s)
    r = timing.ratio(rows[0], rows[picked])
    return {"candidates": [t.to_dict() for t in rows], "picked": picked, "speedup": r.median,
            "speedup_min": r.low, "speedup_max": r.high, "rounds": repeats}
