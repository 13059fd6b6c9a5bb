"""Experiment 02 on this machine: the §4.2 block's graphs timed on XLA:CPU (f32, jit, side by
side) beside the 'cpu' cost model, whose default estimate mirrors XLA:CPU's loop fusion (two
convolutions and one loop doing BN, BN, add and relu for the original block).

The times are reported, not asserted: whether the enlarged graph (step ③) is slower than the
folded one on XLA:CPU is a benchmark figure (`mlsys-jax bench passes`), where it is measured with
paired rounds; its margin here is too small to be a claim.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mlsys_jax import cost, timing
from mlsys_jax.cost.measure import order_disagreements, time_graphs

# A round keeps each graph's fastest of 3 batches of ≥0.05 s (~10 calls of the block): measured
# on 2 quiet cores, one 0.1 s batch per round gave a speedup spread of ±6–18% over 7 rounds and
# 0.25 s batches ±8–14%; the best of three 0.05 s batches ±4–11% in about the same time.
ROUND_S = 0.05
BEST_OF = 3


def measure_cpu(graphs, shape, repeats: int) -> dict:
    """XLA:CPU wall time of original / folded / enlarged / final (jit, f32), side by side, and
    the 'cpu' cost model's estimate of each; ``graphs`` are the five steps' [(jaxpr, log)] at
    the input ``shape``. Speedups are paired ratios (original over the graph, round by round)
    with their min–max over the rounds."""
    chosen = {"original": graphs[0][0], "folded": graphs[1][0], "enlarged": graphs[3][0],
              "final": graphs[5][0]}
    x = jnp.asarray(np.random.default_rng(3).standard_normal(shape), jnp.float32)
    times = time_graphs(chosen, [x], repeats=repeats, min_time_s=ROUND_S, best_of=BEST_OF)
    hw = cost.get_hardware("cpu")
    est = {k: cost.estimate(g, hw=hw).time_us for k, g in chosen.items()}
    rows = []
    for k, g in chosen.items():
        s = timing.ratio(times["original"], times[k])
        rows.append({"graph": k, "measured_us": times[k].median_us, "min_us": times[k].min_s * 1e6,
                     "max_us": times[k].max_s * 1e6, "speedup": s.median,
                     "speedup_range": f"{s.low:.3g}–{s.high:.3g}", "estimate_us": est[k],
                     "estimated_speedup": est["original"] / est[k],
                     "gflops": cost.estimate(g).total_flops / 1e9})
    measured_order = sorted(chosen, key=lambda k: times[k].median_s)
    estimated_order = sorted(chosen, key=lambda k: est[k])
    speedup = timing.ratio(times["original"], times["final"])
    disagree = order_disagreements(times, est)
    achieved = rows[2]["gflops"] / times["enlarged"].median_s  # GFLOP/s of the enlarged graph
    peak = hw.peak("f32") / 1e9
    spread = max(speedup.high / speedup.median - 1, 1 - speedup.low / speedup.median)
    note = (f"XLA:CPU at {'×'.join(map(str, shape))} f32: original/final = {speedup.median:.3g}× "
            f"[{speedup.low:.3g}–{speedup.high:.3g}] (paired, median of {repeats} rounds, each "
            f"the fastest of {BEST_OF} batches of ≥{ROUND_S:g} s per graph: spread "
            f"±{spread:.0%}); measured order "
            f"{' < '.join(measured_order)}; cost model ('cpu', XLA:CPU's loop fusion) order "
            f"{' < '.join(estimated_order)}." + _disagreement_note(disagree, achieved, peak))
    return {"rows": rows, "speedup": speedup.median, "speedup_min": speedup.low,
            "speedup_max": speedup.high, "speedup_spread": spread, "achieved_gflops": achieved,
            "peak_gflops": peak, "measured_order": measured_order,
            "estimated_order": estimated_order, "disagree": disagree, "note": note}


def _disagreement_note(disagree, achieved_gflops, peak_gflops) -> str:
    """Why the 'cpu' cost model and the measurement order the graphs differently (if they do):
    the pairs the measurement separates by more than 15% and the estimate orders otherwise."""
    if not disagree:
        return " The estimate orders every pair the measurement separates (>15%) the same way."
    share = achieved_gflops / peak_gflops
    pairs = ", ".join(f"{a} > {b}" for a, b in disagree)
    return (f" Measured {pairs}, estimated otherwise: XLA:CPU's convolutions run at "
            f"{achieved_gflops:.3g} GFLOP/s, {share:.0%} of the calibrated matmul peak "
            f"({peak_gflops:.3g} GFLOP/s), which the model assumes for every conv.")
