"""A user's ``loss_fn(params, batch)`` as a function of flat lists of arrays.

The array leaves of ``params`` are differentiated; its non-array leaves (an equinox module's
activation function, a Python float field) are static and closed over, as ``eqx.filter_grad``
treats them; an integer, boolean or PRNG-key array in ``params`` is an error (it has no gradient:
move it to the batch). The batch may hold any arrays (integer labels, boolean masks); it is never
differentiated.

The loss is traced once here (``FlatLoss.closed``); ``FlatLoss.replay`` evaluates that trace, so
the programs compiled from it — no remat, JAX's policies — do not run the user's Python again
(re-tracing flax's modules takes seconds at GPT-2's size). Re-binding every equation
of the trace lowers to the same module as tracing the user's function (the equations are the
same, ``checkpoint_name``'s ``name`` equations and ``jit`` calls included):
tests/remat/test_replay.py checks the fingerprints.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import jaxpr_as_fun
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.differentiable import check_grad_traces


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


@dataclass(frozen=True)
class FlatLoss:
    """``loss_fn(params, batch)`` as ``fn(diff, batch_leaves)`` over lists of arrays."""

    fn: Callable
    diff: list               # the differentiated parameter leaves
    batch: list              # the batch's array leaves
    unflatten: Callable      # diff leaves -> the params pytree (static leaves restored)
    split: Callable          # (params, batch) -> (diff, batch leaves), same structure as here
    closed: object = None    # the loss traced over (*diff, *batch): a ClosedJaxpr
    replay: Callable = None  # fn's equivalent from ``closed``: the user's Python does not run


def flatten_loss(loss_fn, params, batch, api: str = "remat") -> FlatLoss:
    """Split ``params`` into differentiated leaves and static ones; check every leaf."""
    if not callable(loss_fn):
        raise MlsysError(f"{api}: loss_fn must be callable, got {type(loss_fn).__name__}")
    leaves, ptree = jax.tree_util.tree_flatten_with_path(params)
    diff_at = []
    for i, (path, leaf) in enumerate(leaves):
        if not _is_array(leaf):
            continue                                    # static: closed over, not differentiated
        if not jax.dtypes.issubdtype(leaf.dtype, jnp.inexact):
            raise MlsysError(
                f"{api}: parameter leaf params{jax.tree_util.keystr(path)} is "
                f"{leaf.dtype}{list(leaf.shape)}, which cannot be differentiated; move it to "
                "the batch (loss_fn's second argument) or make it a static field")
        diff_at.append(i)
    if not diff_at:
        raise MlsysError(f"{api}: params has no float array leaf to differentiate; return the "
                         "model's parameters first: (loss_fn, params, batch)")
    blist, btree = jax.tree_util.tree_flatten(batch)
    b_at = [i for i, b in enumerate(blist) if _is_array(b)]
    values = [leaf for _, leaf in leaves]

    def unflatten(diff):
        full = list(values)
        for i, d in zip(diff_at, diff):
            full[i] = d
        return jax.tree_util.tree_unflatten(ptree, full)

    def fn(diff, batch_leaves):
        full = list(blist)
        for i, b in zip(b_at, batch_leaves):
            full[i] = b
        return loss_fn(unflatten(diff), jax.tree_util.tree_unflatten(btree, full))

    def split(p, b):
        pl, bl = jax.tree_util.tree_flatten(p)[0], jax.tree_util.tree_flatten(b)[0]
        return [pl[i] for i in diff_at], [bl[i] for i in b_at]

    flat = FlatLoss(fn, [values[i] for i in diff_at], [blist[i] for i in b_at], unflatten, split)
    closed = _check_scalar_loss(flat, api)
    check_grad_traces(flat.fn, (flat.diff, flat.batch), what="loss_fn", closed=closed)
    return replace(flat, closed=closed, replay=replayed(closed))


def replayed(closed) -> Callable:
    """``fn(diff, batch_leaves)`` evaluating the traced loss ``closed``: one function per trace,
    so ``jax.checkpoint`` (which caches its trace by function) traces it once for every policy."""
    run = jaxpr_as_fun(closed)

    def replay(diff, batch_leaves):
        return run(*diff, *batch_leaves)[0]
    return replay


def _check_scalar_loss(flat: FlatLoss, api: str):
    """The loss traced (its ClosedJaxpr), checked to return one float scalar."""
    try:
        closed, out = jax.make_jaxpr(flat.fn, return_shape=True)(flat.diff, flat.batch)
    except MlsysError:
        raise
    except Exception as e:  # the user's loss may raise anything: one line names it
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise MlsysError(f"{api}: loss_fn(params, batch) failed: {type(e).__name__}: "
                         f"{msg}") from None
    if not (hasattr(out, "shape") and out.shape == () and jnp.issubdtype(out.dtype, jnp.floating)):
        got = jax.tree_util.tree_map(lambda a: f"{a.dtype}{list(a.shape)}", out)
        raise MlsysError(f"{api}: loss_fn(params, batch) must return one float scalar (the loss) "
                         f"to be differentiated; it returns {got}")
    return closed
