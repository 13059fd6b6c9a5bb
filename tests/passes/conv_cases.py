"""Shared conv-test helpers: float64 kernels, inputs and BatchNorm statistics in NCHW/NHWC, and a
one-compile comparison of two jaxprs' outputs (``tests/test_passes_conv*.py``)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import ir

F64 = jnp.float64


def block_params(c):
    """Parameters of models.resnet_block with c channels (float64)."""
    return {"w3": kernel("NCHW", c, c, 3, 11), "w1": kernel("NCHW", c, c, 1, 12),
            "bn3": bn(c, 20), "bn1": bn(c, 30)}


LAYOUTS = {"NCHW": ("NCHW", "OIHW", "NCHW"), "NHWC": ("NHWC", "HWIO", "NHWC")}


def rand(key, shape, dtype=F64, scale=1.0):  # NumPy: no compile per shape
    return jnp.asarray(scale * np.random.default_rng(key).standard_normal(shape), dtype)


def kernel(layout, o, i, k, key=1):
    shape = (o, i, k, k) if layout == "NCHW" else (k, k, i, o)
    return rand(key, shape, scale=0.3)


def image(layout, n=2, c=4, h=9):
    return rand(7, (n, c, h, h) if layout == "NCHW" else (n, h, h, c))


def bn(c, key=3):
    return {"gamma": 1 + rand(key, (c,), scale=0.3), "beta": rand(key + 1, (c,), scale=0.3),
            "mean": rand(key + 2, (c,), scale=0.3), "var": 1 + jnp.abs(rand(key + 3, (c,)))}


def chan(v, layout):
    return v[None, :, None, None] if layout == "NCHW" else v


def close(c0, c1, *args):
    outs = jax.jit(lambda *a: (ir.interpret(c0, *a), ir.interpret(c1, *a)))(*args)  # one compile
    for a, b in zip(*outs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
