"""A validation's float64 contractions, each computed once for both sides of a rewrite.

Translation validation (``passes/validate.py``) evaluates a region and its replacement in float64
on the same draws, and the two sides often contract the same image with the same weights: a
fold's float64 kernel is the region's own, scaled (``ir.scaled``). Reading the weights is what a
contraction costs. Inside :func:`sharing`, a conv or dot_general whose params equal those of one
computed before, and whose operands are that one's — a large operand (the weights) the very
buffer (the same memory, shape, strides and dtype), a small one (the image) equal element by
element — returns that result: the same function of the same values. The results handed out are
read-only, so no caller can change the other side's value.

A region runs in its float32 first, then in float64 on the same draws: a conv reading an input
reads it widened there, and the same weights. Inside :func:`twinning` (the region's float32 run),
such a conv computes its float64 twin in the same pass over its weights
(``ir.numpy_eval.conv_twins``) and keeps it as the conv of those operands widened, for the
float64 run to find: the weights read once for both.
"""
from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import numpy as np

from mlsys_jax.compat import Tracer
from mlsys_jax.ir import numpy_eval

CONTRACTIONS = ("conv_general_dilated", "dot_general")
BY_VALUE = 1 << 20  # operands up to this many elements are compared element by element
# (a millisecond; a contraction reading them costs more)
KEEP = 8  # contractions remembered (a region has a few)
_MEMO = contextvars.ContextVar("mlsys_jax_shared_contractions", default=None)
_TWINNING = contextvars.ContextVar("mlsys_jax_shared_contractions_twinning", default=False)


@contextlib.contextmanager
def sharing():
    """Inside, :func:`lookup` finds what :func:`remember` kept (one validation of one region)."""
    token = _MEMO.set([])
    try:
        yield
    finally:
        _MEMO.reset(token)


@contextlib.contextmanager
def twinning(on: bool = True):
    """Inside (and inside :func:`sharing`), :func:`with_twin` keeps float64 twins."""
    token = _TWINNING.set(on)
    try:
        yield
    finally:
        _TWINNING.reset(token)


def with_twin(eqn, args) -> list | None:
    """Inside :func:`twinning` and :func:`sharing`: a float32 conv's outputs computed with its
    float64 twin (``ir.numpy_eval.conv_twins``), the twin kept for :func:`lookup` as the conv
    of the operands widened; None otherwise (computed as usual)."""
    if eqn.primitive.name != CONTRACTIONS[0] or not _TWINNING.get() or _MEMO.get() is None \
            or math.prod(np.shape(args[0])) > BY_VALUE:
        return None  # (a larger image is never found again by value)
    got = numpy_eval.conv_twins(eqn, args)
    if got is None:
        return None
    outs, twin = got
    x, w = _arrays(args)
    remember(eqn, [x.astype(np.float64), w], twin)
    return outs


def _arrays(args) -> list | None:
    """``args`` as NumPy arrays (a CPU ``jax.Array`` viewed in place), None if one is not
    concrete (a tracer) or not an array."""
    out = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(a)
        elif isinstance(a, jax.Array) and not isinstance(a, Tracer):
            out.append(np.asarray(a))
        else:
            return None
    return out


def _buffer(a: np.ndarray, b: np.ndarray) -> bool | None:
    """True: the same memory; False: cannot be equal; None: equal only if their values are."""
    if a is b or (a.shape == b.shape and a.dtype == b.dtype
                  and a.ctypes.data == b.ctypes.data and a.strides == b.strides):
        return True
    if a.shape != b.shape or a.dtype != b.dtype or a.size > BY_VALUE:
        return False
    return None


def _same(kept: list, arrays: list) -> bool:
    """The operands are those kept: each the same buffer, or small and equal element by
    element (compared only once every other operand matches)."""
    if len(kept) != len(arrays):
        return False
    buffers = [_buffer(a, b) for a, b in zip(kept, arrays)]
    return all(x is not False for x in buffers) and all(
        x or np.array_equal(a, b) for x, a, b in zip(buffers, kept, arrays))


def lookup(eqn, args) -> list | None:
    """The outputs of a contraction computed inside this :func:`sharing` on these operands, or
    None."""
    memo = _MEMO.get()
    if memo is None or eqn.primitive.name not in CONTRACTIONS:
        return None
    arrays = _arrays(args)
    if arrays is None:
        return None
    for e, kept, outs in memo:
        if e.primitive is eqn.primitive and e.params == eqn.params and _same(kept, arrays):
            return list(outs)
    return None


def remember(eqn, args, outs: list) -> list:
    """Keep ``outs`` (made read-only; XLA's as NumPy views) for :func:`lookup`; returns them."""
    memo = _MEMO.get()
    if memo is None or eqn.primitive.name not in CONTRACTIONS:
        return outs
    arrays, outs_np = _arrays(args), _arrays(outs)  # (XLA's outputs viewed in place)
    if arrays is None or outs_np is None:
        return outs
    for o in outs_np:
        o.flags.writeable = False
    memo.append((eqn, arrays, outs_np))
    del memo[:-KEEP]
    return outs_np
