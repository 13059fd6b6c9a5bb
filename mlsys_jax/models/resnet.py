"""The §4.2 ResNet block: conv3x3→BN ∥ conv1x1→BN → add → relu (NCHW / OIHW), and the forms the
lecture's five rewrite steps lead to, written by hand (the passes of ``mlsys_jax.passes`` must
reach them automatically).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

DIMS = ("NCHW", "OIHW", "NCHW")
BN_EPS = 1e-5


def conv(x, w, padding: int):
    """A stride-1 2-D convolution, NCHW × OIHW, symmetric zero padding."""
    return lax.conv_general_dilated(x, w, (1, 1), [(padding, padding)] * 2, dimension_numbers=DIMS)


@jax.jit
def batch_norm(z, gamma, beta, mean, var):
    """Inference-mode BatchNorm over channel axis 1: ``(z - mean) / sqrt(var + eps) * gamma + beta``.

    Computed as a per-channel scale and shift (the channel vectors are tiny), one named op.
    """
    scale = gamma * lax.rsqrt(var + BN_EPS)
    shift = beta - mean * scale
    return z * scale[None, :, None, None] + shift[None, :, None, None]


@jax.jit
def conv_bias(x, w, b):
    """Convolution plus a per-output-channel bias, one named op (the lecture's ``Conv(X, W) + B``).

    'SAME' padding for odd kernel sizes, so 1×1 and 3×3 kernels give the same output shape.
    """
    return conv(x, w, w.shape[-1] // 2) + b[None, :, None, None]


def _bn_params(key, c, dtype):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return {"gamma": (1 + 0.1 * jax.random.normal(k1, (c,))).astype(dtype),
            "beta": (0.1 * jax.random.normal(k2, (c,))).astype(dtype),
            "mean": (0.1 * jax.random.normal(k3, (c,))).astype(dtype),
            "var": (1 + 0.1 * jax.random.uniform(k4, (c,))).astype(dtype)}


def resnet_block_init(key, c: int = 64, dtype=jnp.float32) -> dict:
    """Parameters: 3×3 and 1×1 kernels (c→c) and inference BN statistics for each branch."""
    k3, k1, kb3, kb1 = jax.random.split(key, 4)
    return {"w3": (jax.random.normal(k3, (c, c, 3, 3)) / jnp.sqrt(9.0 * c)).astype(dtype),
            "w1": (jax.random.normal(k1, (c, c, 1, 1)) / jnp.sqrt(1.0 * c)).astype(dtype),
            "bn3": _bn_params(kb3, c, dtype), "bn1": _bn_params(kb1, c, dtype)}


def resnet_block(params: dict, x):
    """The original block: 6 ops — conv, batch_norm, conv, batch_norm, add, relu."""
    a = batch_norm(conv(x, params["w3"], 1), **params["bn3"])
    b = batch_norm(conv(x, params["w1"], 0), **params["bn1"])
    return jax.nn.relu(a + b)


# ---- The lecture's rewrite steps, by hand (§4.2 table; exercise 3 for the fold) ----

def fold_bn(w, bn: dict, bias=None):
    """§4.1 rule (1): s = γ/√(σ²+ε); W' = W·s (per output channel); B' = (B − μ)·s + β."""
    s = bn["gamma"] * lax.rsqrt(bn["var"] + BN_EPS)
    b = jnp.zeros_like(bn["mean"]) if bias is None else bias
    return w * s[:, None, None, None], (b - bn["mean"]) * s + bn["beta"]


def fold_block_params(params: dict) -> dict:
    """Step ①: both BNs folded into their convolutions."""
    w3, b3 = fold_bn(params["w3"], params["bn3"])
    w1, b1 = fold_bn(params["w1"], params["bn1"])
    return {"w3": w3, "b3": b3, "w1": w1, "b1": b1}


def resnet_block_folded(folded: dict, x):
    """After step ①: 4 ops — conv_bias, conv_bias, add, relu."""
    return jax.nn.relu(conv_bias(x, folded["w3"], folded["b3"]) + conv_bias(x, folded["w1"], folded["b1"]))


def enlarge_kernel(w, k: int = 3):
    """Step ③: a 1×1 kernel zero-padded to k×k (centred); with padding k//2 the output is unchanged."""
    p = (k - w.shape[-1]) // 2
    return jnp.pad(w, ((0, 0), (0, 0), (p, p), (p, p)))


def enlarge_block_params(folded: dict) -> dict:
    """Folded block parameters with ``w1`` padded to ``w3``'s kernel size (§4.2 step ③)."""
    return {**folded, "w1": enlarge_kernel(folded["w1"], folded["w3"].shape[-1])}


def merge_block_params(enlarged: dict) -> dict:
    """Step ④: §4.1 rule (2), Conv(X, W1) + Conv(X, W2) = Conv(X, W1 + W2)."""
    return {"w": enlarged["w3"] + enlarged["w1"], "b": enlarged["b3"] + enlarged["b1"]}


def resnet_block_merged(merged: dict, x):
    """Step ⑤: 2 ops — conv_bias (3×3′) and relu."""
    return jax.nn.relu(conv_bias(x, merged["w"], merged["b"]))
