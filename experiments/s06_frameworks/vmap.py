"""Experiment 06 — ``vmap`` (seed 001): per-example gradients in one vectorized call vs a Python
loop of jitted gradient calls."""
from __future__ import annotations

import jax
import numpy as np

from experiments._inputs import small_model
from mlsys_jax import models, timing


def _loss_one(params, x, y):
    return models.mlp_loss(params, x[None], y[None])


def per_example(batch: int, repeats: int, sizes=(64, 32, 10)):
    # A small MLP: per-example work is tiny, as in per-example clipping/privacy use cases; the
    # lecture's 784→100→10 would make both sides write B × 80k gradient floats and time memory.
    params, x, y = small_model(batch, sizes)["args"]
    # Rows sliced once, outside the timing, via NumPy (iterating a jax.Array dispatches per row).
    xs, ys = ([jax.device_put(row) for row in np.asarray(a)] for a in (x, y))
    one = jax.jit(jax.grad(_loss_one))
    batched = jax.jit(jax.vmap(jax.grad(_loss_one), in_axes=(None, 0, 0)))
    loop = lambda: [one(params, xi, yi) for xi, yi in zip(xs, ys)]
    looped, vmapped = loop(), batched(params, x, y)
    vmapped = {k: np.asarray(v) for k, v in vmapped.items()}  # compare on the host
    match = all(np.allclose(vmapped[k][i], np.asarray(g[k]), rtol=1e-5, atol=1e-6)
                for i, g in enumerate(looped) for k in g)
    t = timing.compare({"loop": loop, "vmap": lambda: batched(params, x, y)}, repeats=repeats)
    ratio = timing.ratio(t["loop"], t["vmap"]).median
    rows = [{"method": f"Python loop of {batch} jitted grad calls, MLP {'→'.join(map(str, sizes))}",
             "us": t["loop"].median_us,
             "x_vs_vmap": ratio},
            {"method": "jit(vmap(grad)) — one call", "us": t["vmap"].median_us, "x_vs_vmap": 1.0}]
    return rows, {"loop/vmap": ratio, "match": match, "batch": batch}
