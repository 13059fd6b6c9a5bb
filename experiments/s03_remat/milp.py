"""Experiment 03, part 4: the MILP planner on a non-chain graph (gated residual MLP) at budgets."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.errors import MlsysError


def gated_residual_mlp(ws, x):
    """Blocks h += tanh(h Wa) · sigmoid(h Wb): two branches and a skip per block (not a chain)."""
    h = x
    for i in range(ws.shape[0]):
        h = h + jnp.tanh(h @ ws[i, 0]) * jax.nn.sigmoid(h @ ws[i, 1])
    return 0.5 * jnp.sum(h * h)


def graph_inputs(blocks: int, width: int = 16, batch: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    ws = jnp.asarray(rng.standard_normal((blocks, 2, width, width)) / np.sqrt(width))
    return ws, jnp.asarray(rng.standard_normal((batch, width)))


def milp_rows(n_budgets: int, blocks: int = 4) -> tuple[list[dict], list[str]]:
    try:
        from mlsys_jax.remat.two_stage import measure, problem
        import scipy  # noqa: F401
    except ImportError:
        return [], ["MILP planner skipped: scipy is not installed (the 'solver' extra: "
                    "pip install -e '.[solver]')"]
    if n_budgets < 1:
        raise MlsysError(f"experiment 03: milp_budgets must be >= 0, got {n_budgets}")
    ws, x = graph_inputs(blocks)
    prob = problem(gated_residual_mlp, ws, x)
    free = prob.solve(2**62)                  # no memory limit: no recompute
    lo, hi = free.min_peak_budget_bytes, free.predicted_peak_bytes
    budgets = sorted({int(b) for b in np.linspace(lo, hi, n_budgets)})
    ref = jax.jit(jax.grad(gated_residual_mlp, argnums=(0, 1)))(ws, x)
    rows = []
    for budget in budgets:
        p = prob.solve(budget)
        m = measure(gated_residual_mlp, p, ws, x)
        rows.append({"budget_bytes": budget, "values": p.n_values, "planned_saved": len(p.saved),
                     "measured_saved": m["saved_count"], "same_names": set(p.saved) == set(m["saved_names"]),
                     "predicted_peak_bytes": p.predicted_peak_bytes, "measured_peak_bytes": m["peak_bytes"],
                     "within_budget": max(p.predicted_peak_bytes, m["peak_bytes"]) <= budget,
                     "recompute_flops": p.recompute_flops, "xla_temp_bytes": m["xla_temp_bytes"],
                     "store_all_bytes": p.store_all_bytes, "solve_ms": round(1e3 * p.solve_seconds, 1),
                     "grads_bitwise": all(bool(np.array_equal(a, b)) for a, b in zip(m["grads"], ref))})
    notes = ["MILP: Checkmate's formulation reduced to two stages (each value saved, or recomputed "
             "once before the backward), the decisions jax.checkpoint's names policy can express; "
             "FLOPs from the cost model, solved by scipy's HiGHS",
             f"MILP graph: {blocks} gated residual blocks h += tanh(h·Wa)·sigmoid(h·Wb) "
             f"({free.n_values} values); budgets from the minimum (arguments only, everything "
             "recomputed) to the smallest budget that needs no recompute. Peak = bytes held from "
             "the forward to the backward (JAX's residuals, measured by saved_residuals); XLA's "
             "temp bytes also hold the backward's working buffers, so they exceed the peak"]
    return rows, notes
