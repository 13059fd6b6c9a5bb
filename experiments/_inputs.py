"""Host-built inputs shared by experiments 05 and 06 (and their benchmarks).

Arrays are built with NumPy on the host and transferred with ``device_put``: a device-side cast
or a ``jax.random`` draw compiles a program per shape, which would dominate these short,
timing-heavy experiments on a shared machine.
"""
from __future__ import annotations

import math

import jax
import numpy as np

from mlsys_jax import models


def f32(a) -> jax.Array:
    """A float32 device array from host data, cast on the host and transferred with device_put:
    a device-side cast (float64 → float32 under x64), and jnp.asarray itself in JAX 0.10, compile
    a program per shape (docs/jax-notes.md, "Dispatch")."""
    return jax.device_put(np.asarray(a, dtype=np.float32))


def ramp(n: int) -> jax.Array:
    """n float32 values evenly spaced in [0, 1] (host-built, like :func:`f32`)."""
    return f32(np.linspace(0.0, 1.0, n))


def f64(a) -> jax.Array:
    """A float64 device array from host data (device_put: no per-shape program, see f32)."""
    return jax.device_put(np.asarray(a, dtype=np.float64))


def normal(rng, shape, scale=1.0) -> jax.Array:
    """float32 normal draws × ``scale`` from a NumPy generator."""
    # NumPy draws, not jax.random: each jax.random shape compiles a program, which would
    # dominate an experiment's time (docs/jax-notes.md, "Dispatch").
    return f32(rng.standard_normal(shape) * scale)


def small_model(batch: int, sizes=(784, 100, 10)) -> dict:
    """The lecture's MNIST-shaped classifier (784→100→10 by default), one loss evaluation."""
    rng = np.random.default_rng(1)
    # The structure of models.mlp_init (scaled-normal W, zero b), drawn with NumPy (see normal).
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"W{i}"] = normal(rng, (n_in, n_out), 1 / math.sqrt(n_in))
        params[f"b{i}"] = f32(np.zeros(n_out))
    x = normal(rng, (batch, sizes[0]))
    y = f32(np.eye(sizes[-1])[rng.integers(0, sizes[-1], batch)])
    return {"name": f"MLP {'→'.join(map(str, sizes))} loss, batch {batch}", "fn": models.mlp_loss,
            "args": (params, x, y), "jit": jax.jit(models.mlp_loss)}
