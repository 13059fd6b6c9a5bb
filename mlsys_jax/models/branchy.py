"""The lecture's demo 4 / exercise 8 function, three ways (§8.4): a data-dependent Python ``if``
(one graph break under capture), ``jnp.where`` (one graph, both branches computed) and
``lax.cond`` (one graph, one branch run: TF's Switch/Merge)."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def mlp2(x, w1, w2):
    """``relu(x @ w1) @ w2``: straight-line code, one graph."""
    return jax.nn.relu(x @ w1) @ w2


def branchy(x, w1):
    """``h = relu(x @ w1); h * 2 if h.sum() > 0 else exp(h)`` with a Python ``if``."""
    h = jax.nn.relu(x @ w1)
    if h.sum() > 0:
        return h * 2
    else:
        return jnp.exp(h)


def branchy_where(x, w1):
    """Exercise 8 with ``jnp.where``: no Python branch, both sides computed."""
    h = jax.nn.relu(x @ w1)
    return jnp.where(h.sum() > 0, h * 2, jnp.exp(h))


def branchy_cond(x, w1):
    """Exercise 8 with ``lax.cond``: the branch is a graph op, only one side runs."""
    h = jax.nn.relu(x @ w1)
    return jax.lax.cond(h.sum() > 0, lambda h: h * 2, jnp.exp, h)
