"""Recomputation the compiler keeps (lecture §7.2 on XLA).

Measured on XLA:CPU (jax 0.10): ``jax.checkpoint`` wraps the recomputation's inputs in an
``optimization_barrier``, but the CPU pipeline runs ``cse_barrier_expander`` (which deletes the
barriers) *before* CSE, so CSE merges the recomputation with the forward pass: the compiled
gradient has no remat's FLOPs and, with segments in an unrolled loop, no remat's temp bytes. Two
structures survive: a loop (``scan(checkpoint(scan(layer)))``, used for scanned layer stacks) and
a conditional — CSE and loop-invariant code motion do not look into a branch.

:func:`pinned` runs a backward inside ``lax.cond`` with two identical branches and a predicate
read from the data. The predicate's value does not matter (both branches compute the same), but
XLA cannot know it, so the recomputation stays; and since the branch needs the incoming
cotangent, it cannot run before the backward reaches it, so recomputed values are live only
while that part of the backward runs. ``compiled`` (a plan's segments) and :func:`checkpoint` (a
layer list's segments) use it. ``cost_analysis`` counts a conditional's costliest branch, so
the recomputation shows in compiled FLOPs; a while loop's body it counts once, whatever the trip
count, so a scanned stack's recomputation shows there only as one body's worth.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def _first_float(tree):
    for leaf in jax.tree_util.tree_leaves(tree):
        if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating) and leaf.size:
            return lax.reshape(leaf, (leaf.size,))[0] >= 0
    return None


def pinned(run, residuals, cotangent):
    """``run(residuals, cotangent)`` inside a conditional XLA cannot remove.

    The predicate mixes the cotangent (the branch waits for the backward to reach it) with a
    residual: the loss's own cotangent is the constant 1.0, which XLA would fold away.
    """
    from_ct, from_res = _first_float(cotangent), _first_float(residuals)
    if from_ct is None:             # nothing flows back: no recomputation is needed either
        return run(residuals, cotangent)
    pick = from_ct if from_res is None else from_ct != from_res
    return lax.cond(pick, run, run, residuals, cotangent)


def checkpoint(fn):
    """``fn(*args)`` (a tuple of arrays out) whose gradient keeps only its inputs and recomputes
    everything else in the backward — ``jax.checkpoint`` with ``nothing_saveable`` — in a way the
    compiler cannot undo.

    Example::

        seg = checkpoint(lambda w, h: (jnp.tanh(h @ w),))
        jax.grad(lambda w, h: jnp.sum(seg(w, h)[0]))(w, h)
    """
    inner = jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def forward(*args):
        out, vjp = jax.vjp(inner, *args)      # vjp is a pytree: its leaves are the residuals
        return out, vjp

    wrapped.defvjp(forward, lambda vjp, cotangent: pinned(lambda v, c: v(c), vjp, cotangent))
    return wrapped
