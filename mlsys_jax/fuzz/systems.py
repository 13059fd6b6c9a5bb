"""Oracles for schedules and layouts (docs/verification.md §3): remat and data parallelism on random cases.

Remat: a random chain length N and segment length K; the schedule's gradients must be bitwise those
of storing everything, and its claimed counts (peak activations, layer forwards) must be what the
reference executor measures. Parallel: a random small classifier and batch; one data-parallel step
on the simulated devices must match the single-device step (params and gradients, error ratio ≤ 2
against a float64 step).
"""
from __future__ import annotations

import numpy as np


def remat_case(seed: int) -> list:
    """Failures (strings) of one random remat case; [] when it holds."""
    from mlsys_jax.remat import chain_inputs, every_k, run_reference, store_all
    from mlsys_jax.remat.chain.jax_exec import run_jax

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 9))
    k = int(rng.integers(1, n + 1))
    x, ws = chain_inputs(n, width=8, batch=2, seed=seed)
    x, ws = x.astype(np.float32), ws.astype(np.float32)
    sched, base = every_k(n, k), store_all(n)
    fails = []
    got = run_jax(sched, x, ws, compile_memory=False)
    want = run_jax(base, x, ws, compile_memory=False)
    if got.grads.tobytes() != want.grads.tobytes():
        fails.append(f"remat every_k({n},{k}): gradients not bitwise equal to store_all")
    claimed, measured = sched.counts(), run_reference(sched, x.astype(np.float64),
                                                       ws.astype(np.float64))
    if (claimed.peak_activations, claimed.layer_forwards) != (measured.peak_activations,
                                                              measured.layer_forwards):
        fails.append(f"remat every_k({n},{k}): claims peak {claimed.peak_activations}, forwards "
                     f"{claimed.layer_forwards}; executor measured {measured.peak_activations}, "
                     f"{measured.layer_forwards}")
    return fails


def dp_case(seed: int, reduction: str = "weighted") -> list | None:
    """Failures of one random data-parallel step against the single-device step (None: skipped,
    fewer than 2 devices)."""
    import jax
    import optax

    from mlsys_jax.models.mlp import mlp_loss
    from mlsys_jax.parallel.lecture.data import demo_problem, flatten, make_dp_step, make_single_step
    from mlsys_jax.parallel.mesh import make_mesh

    rng = np.random.default_rng(seed)
    choices = [d for d in (2, 4, 8) if d <= jax.device_count()]
    if not choices:
        return None
    devices = int(rng.choice(choices))
    sizes = (int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(2, 4)))
    batch = devices * int(rng.integers(1, 4))
    params, x, y = demo_problem(seed, batch, sizes, dtype=np.float32)
    opt = optax.sgd(0.1)
    mesh = make_mesh({"data": devices})
    new_p, _, _, g = make_dp_step(mlp_loss, opt, mesh, reduction=reduction)(
        params, opt.init(params), x, y)
    ref_p, _, _, ref_g = make_single_step(mlp_loss, opt)(params, opt.init(params), x, y)
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    hi_p, _, _, hi_g = make_single_step(mlp_loss, opt)(p64, opt.init(p64), x.astype(np.float64),
                                                       y.astype(np.float64))
    fails = []
    for what, got, want, hi in (("params", new_p, ref_p, hi_p), ("grads", g, ref_g, hi_g)):
        got, want, hi = flatten(got), flatten(want), flatten(hi)
        ratio = np.max(np.abs(got - hi)) / (np.max(np.abs(want - hi)) + 5e-6)
        if not ratio <= 2:  # (a NaN anywhere fails too)
            fails.append(f"data parallel ({reduction}, {devices} devices): {what} error ratio "
                         f"{ratio:.3g} vs the single-device step")
    return fails
