"""Example factories whose parameters hold one large array (``bench inspect``): a dense layer
``relu(x @ W + b)`` and a 1×1 convolution with an inference BatchNorm after it (which
``fold_conv_bn`` rewrites, so ``optimize`` makes a new kernel as large as the old one).

The weights are made lean — a hash of each element's index, one fused loop, no random-number
temporaries — so a process running a factory holds the parameters and little else: what
``mlsys-jax inspect`` and ``optimize`` add on top is theirs. ``python -m benchmarks._big_params
NAME`` runs one factory alone (the baseline the benchmark measures beside them).
"""
from __future__ import annotations

import math
import sys
from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

MIB = 1 << 20


@partial(jax.jit, static_argnums=0)
def _weights(shape):
    i = lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
    h = (i * jnp.uint32(2654435761)) ^ (i >> 13)
    return (lax.bitcast_convert_type((h >> 9) | 0x3F800000, jnp.float32) - 1.5) * 0.02


def dense(mib: int):
    """``relu(x @ W + b)`` with ``W`` of ``mib`` MiB (8192 inputs)."""
    rows = 8192
    cols = mib * MIB // (4 * rows)
    params = {"w": _weights((rows, cols)), "b": jnp.zeros((cols,), jnp.float32)}
    return (lambda p, x: jax.nn.relu(x @ p["w"] + p["b"])), (params, jnp.ones((4, rows)))


def conv_bn(mib: int):
    """A 1×1 convolution (NHWC, 8192 input channels) with ``mib`` MiB of kernel, then BatchNorm
    with running statistics."""
    cin = 8192
    cout = mib * MIB // (4 * cin)
    params = {"w": _weights((1, 1, cin, cout)),
              "mean": jnp.linspace(-0.5, 0.5, cout), "var": jnp.linspace(0.5, 1.5, cout),
              "gamma": jnp.linspace(0.8, 1.2, cout), "beta": jnp.linspace(-0.1, 0.1, cout)}

    def f(p, x):
        y = lax.conv_general_dilated(x, p["w"], (1, 1), "VALID",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y - p["mean"]) * lax.rsqrt(p["var"] + 1e-5) * p["gamma"] + p["beta"]
    return f, (params, jnp.ones((1, 4, 4, cin)))


def elementwise(mib: int):
    """``sin(w) * 2 + sum(x)`` with ``w`` of ``mib`` MiB: ``fold_constants`` folds ``sin(w) * 2``
    into a new constant as large as ``w`` (issue #39: this peaked at 9.2 GB at 512 MiB)."""
    params = {"w": _weights((mib * MIB // 4,))}
    return (lambda p, x: jnp.sin(p["w"]) * 2 + x.sum()), (params, jnp.ones((8,), jnp.float32))


def dense_64mib():
    return dense(64)


def conv_bn_64mib():
    return conv_bn(64)


def dense_512mib():
    return dense(512)


def conv_bn_512mib():
    return conv_bn(512)


def elementwise_64mib():
    return elementwise(64)


def elementwise_512mib():
    return elementwise(512)


def dense_4gib():
    return dense(4096)


if __name__ == "__main__":  # the factory alone: its parameters, made and ready
    fn, args = globals()[sys.argv[1]]()
    jax.block_until_ready(args)
