"""Rematerialization (experiment 03): K = √N checkpointing vs store-all, and MILP solve times.

Step time (jitted gradient) of the N = 64 tanh chain with every-√N checkpoints over store-all is a
paired ratio from one interleaved comparison (lecture §7.2: about one extra forward, ≈ 1.3× a
step); the XLA temp-memory ratio comes from the same compiled programs. MILP solve times are
seconds on this machine (the runner records its context), for graphs of ~50, ~200, ~500 values.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import timing
from mlsys_jax.remat import every_k, store_all
from mlsys_jax.remat.jax_exec import chain_loss

NAME = "remat"


def _chain_figures(n: int, width: int, batch: int, repeats: int) -> tuple[dict, list[str]]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, width)), dtype=jnp.float32)
    ws = jnp.asarray(rng.standard_normal((n, width, width)) / np.sqrt(width), dtype=jnp.float32)
    k = round(math.sqrt(n))
    compiled = {name: jax.jit(jax.grad(chain_loss(s))).lower(ws, x).compile()
                for name, s in (("store_all", store_all(n)), (f"every_{k}", every_k(n, k)))}
    temp = {name: c.memory_analysis().temp_size_in_bytes for name, c in compiled.items()}
    t = timing.compare({name: (lambda c=c: c(ws, x)) for name, c in compiled.items()},
                       repeats=repeats)
    figures = {f"every_{k}_over_store_all_step_time_ratio":
               timing.ratio(t[f"every_{k}"], t["store_all"]).to_dict(),
               f"every_{k}_over_store_all_xla_temp_ratio": temp[f"every_{k}"] / temp["store_all"]}
    notes = [f"chain N={n}, h' = tanh(h W), float32 {batch}x{width} activations, jitted "
             f"jax.grad; K={k} is scan(checkpoint(scan(layer))); {repeats} interleaved rounds; "
             f"XLA temp bytes: store-all {temp['store_all']}, every-{k} {temp[f'every_{k}']}; "
             f"store-all step median {t['store_all'].median_us:.0f} µs"]
    return figures, notes


def _milp_figures(sizes, repeats: int) -> tuple[dict, list[str]]:
    from experiments._s03_milp import gated_residual_mlp, graph_inputs
    from mlsys_jax.remat.two_stage import problem

    figures, notes = {}, []
    for target in sizes:
        blocks = max(1, round((target - 3) / 10))     # a gated block adds 10 values
        ws, x = graph_inputs(blocks, width=16, batch=8)
        prob = problem(gated_residual_mlp, ws, x)
        free = prob.solve(2**62)
        budget = (prob.arg_bytes + free.predicted_peak_bytes) // 2
        secs = sorted(prob.solve(budget).solve_seconds for _ in range(repeats))
        figures[f"milp_solve_ms_{len(prob.names)}_values"] = 1e3 * secs[len(secs) // 2]
        notes.append(f"MILP {len(prob.names)} values ({blocks} blocks, {2 * len(prob.names)} "
                     f"binaries): median {1e3 * secs[len(secs) // 2]:.1f} ms over {repeats} solves "
                     f"(min {1e3 * secs[0]:.1f}, max {1e3 * secs[-1]:.1f}) at the mid budget")
    return figures, notes


def run(quick: bool = False) -> dict:
    figures, notes = _chain_figures(64, 64 if quick else 256, 32 if quick else 128,
                                    5 if quick else 11)
    try:
        import scipy  # noqa: F401
    except ImportError:
        return {"figures": figures,
                "notes": notes + ["MILP solve times skipped: scipy is not installed ('solver' extra)"]}
    mf, mn = _milp_figures((50, 200) if quick else (50, 200, 500), 3 if quick else 5)
    figures.update(mf)
    return {"figures": figures, "notes": notes + mn}
