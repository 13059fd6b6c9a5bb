"""The lecture's demo 4 / exercise 8 function, three ways (§8.4): a data-dependent Python ``if``
(one graph break under capture), ``jnp.where`` (one graph, both branches computed) and
``lax.cond`` (one graph, one branch run: TF's Switch/Merge); and a two-break variant."""
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


def two_breaks(x, w1, w2):
    """``branchy`` followed by a second layer and a second Python ``if``: two graph breaks."""
    h = jax.nn.relu(x @ w1)
    if h.sum() > 0:
        h = h * 2
    else:
        h = jnp.exp(h)
    g = h @ w2
    if g.sum() > 0:
        return jnp.tanh(g)
    return g * 0.5


def two_breaks_cond(x, w1, w2):
    """``two_breaks`` with ``lax.cond``: one graph, two graph-level branches."""
    h = jax.nn.relu(x @ w1)
    h = jax.lax.cond(h.sum() > 0, lambda h: h * 2, jnp.exp, h)
    g = h @ w2
    return jax.lax.cond(g.sum() > 0, jnp.tanh, lambda g: g * 0.5, g)
