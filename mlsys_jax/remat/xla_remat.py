"""``jax.checkpoint`` whose recomputation the compiler keeps (lecture §7.2 on XLA).

Measured on XLA:CPU (jax 0.10): ``jax.checkpoint`` wraps the recomputation's inputs in an
``optimization_barrier``, but the CPU pipeline runs ``cse_barrier_expander`` (which deletes the
barriers) *before* CSE, so CSE merges the recomputation with the forward pass: the compiled
gradient has the FLOPs and temp bytes of no remat at all, whatever the policy. Two structures
survive: a loop (``scan(checkpoint(scan(layer)))``, used for layer stacks) and a conditional —
CSE and loop-invariant code motion do not look into a branch.

:func:`checkpoint` is the second: a ``custom_vjp`` whose forward keeps only what
``jax.checkpoint(fn, policy=save_only_these_names(*saved))`` keeps, and whose backward runs that
checkpoint's VJP (recomputation included) inside ``lax.cond`` with two identical branches and a
predicate read from the incoming cotangent. The predicate's value does not matter (both branches
compute the same), but XLA cannot know it, so the recomputation stays; and since the branch needs
the cotangent, it cannot run before the backward reaches this segment, so the recomputed values
are live only while the segment's backward runs. Compiled FLOPs count the branch once
(``cost_analysis`` takes the branch maximum), so recomputation shows up in them.
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


def checkpoint(fn, saved_names=()):
    """``fn(*args)`` (a tuple of arrays out) whose gradient keeps only the values named
    ``saved_names`` (``jax.ad_checkpoint.checkpoint_name``) and recomputes the rest, in the
    backward, in a way the compiler cannot undo.

    Example::

        seg = checkpoint(lambda w, h: (jnp.tanh(h @ w),))
        jax.grad(lambda w, h: jnp.sum(seg(w, h)[0]))(w, h)
    """
    policy = jax.checkpoint_policies.save_only_these_names(*saved_names)
    inner = jax.checkpoint(fn, policy=policy)

    @jax.custom_vjp
    def wrapped(*args):
        return fn(*args)

    def forward(*args):
        out, vjp = jax.vjp(inner, *args)      # vjp is a pytree: its leaves are the residuals
        return out, vjp

    def backward(vjp, cotangent):
        return pinned(lambda v, c: v(c), vjp, cotangent)

    wrapped.defvjp(forward, backward)
    return wrapped
