"""The walk from a conv's output along the per-channel affine ops that ``fold_conv_bn`` folds
(§4.1 rule 1), and the reason it stops short when an affine op is in reach but cannot be folded.

The walk follows single-use values through the affine steps of ``passes/affine.py`` and through
movement views (reshape, squeeze, transpose, broadcast), whose channel axis it tracks. It stops silently where nothing foldable follows (a relu, a residual add of
another tensor); it stops *with a reason* where the anchor matched — training-mode BatchNorm (batch
statistics), an integer division, a constant that is not per-channel, a conv output that other ops
read too — so a refusal is never silent. What precedes the stop still folds (stax's conv bias is
merged even though its BatchNorm, in training mode, is refused).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mlsys_jax.ir.opview import op_name
from mlsys_jax.ir.primitives import JIT
from mlsys_jax.passes.affine import (AFFINE, Affine, Refuse, Stop, operand_refusal, step,
                                     through_call)
from mlsys_jax.passes.convsites import Consts, Site


@dataclass
class Chain:
    """What follows one conv: the affine map to fold, the index of its last equation (None:
    nothing to fold), the movement equations before that (replayed on the new conv's output,
    in order) and why the walk stopped at a foldable-looking op (None: nothing to report)."""

    aff: Affine
    end: int | None = None
    moves: list = field(default_factory=list)
    refusal: str | None = None


def affine_chain(jaxpr, consts: Consts, site: Site, users: dict) -> Chain:
    """Follow the conv output through single-use affine ops, named calls and movement views."""
    z = site.out
    shape, fd = z.aval.shape, site.feature_dim
    chain = Chain(Affine.identity(shape[fd], z.aval.dtype))
    aff, t, pending = chain.aff, z, []
    while True:
        us = users.get(t, [])
        if len(us) != 1 or us[0] < 0:
            chain.refusal = _shared(jaxpr, consts, t, us, z, aff, shape, fd)
            break
        e = jaxpr.eqns[us[0]]
        if e.primitive.name in MOVES:
            moved = moved_axis(e, shape, fd)
            if moved is None:
                break
            pending.append(e)
            t, shape, fd = e.outvars[0], tuple(e.outvars[0].aval.shape), moved
            continue
        try:
            aff = (through_call if e.primitive.name in JIT else step)(e, t, consts, aff, shape,
                                                                     fd, z)
        except Stop:
            break
        except Refuse as r:
            chain.refusal = str(r)
            break
        chain.moves += pending
        pending = []
        t, chain.end = e.outvars[0], us[0]
    chain.aff = aff
    if chain.end is not None and not (np.isfinite(aff.a).all() and np.isfinite(aff.b).all()):
        return Chain(Affine.identity(1, np.float64), None, [], "the folded scale or shift is not "
                     "finite (BatchNorm var + eps ≤ 0?); left as it was")
    wdt, zdt = np.dtype(site.w.aval.dtype), np.dtype(z.aval.dtype)
    if chain.end is not None and aff.scaled and zdt.kind in "iu" and wdt != zdt:
        return Chain(Affine.identity(1, np.float64), None, [], f"{wdt} weights of a conv into "
                     f"{zdt} cannot hold the scaled weights exactly (integer products wrap at the "
                     "weights' width); left as it was")
    return chain


def _shared(jaxpr, consts: Consts, t, us, z, aff: Affine, shape, fd) -> str | None:
    """Why a value read by several ops (or returned) is not folded further, when one of its
    readers is an affine op we could otherwise fold; None when none is."""
    readers = [jaxpr.eqns[u] for u in us if u >= 0]
    # Training-mode BN reads z for its statistics too: name the op that normalises with them
    # (``batch_norm``'s 'mean', an inline sub) before a call that only computes them (``_var``).
    for e in readers:
        if e.primitive.name in AFFINE:
            for o in e.invars:
                why = None if o is t or consts.value(o) is not None else operand_refusal(
                    consts, o, z, shape, fd, f"the {e.primitive.name} operand")
                if why:
                    return why
    calls = [e for e in readers if e.primitive.name in JIT]
    calls.sort(key=lambda e: all(o is t or consts.value(o) is not None for o in e.invars))
    for e in calls:  # those reading another traced value (the statistics) first
        try:
            through_call(e, t, consts, aff, shape, fd, z)
        except Refuse as r:
            return str(r)
        except Stop:
            pass
    foldable = [e for e in readers if e.primitive.name in AFFINE and len(e.invars) == 2
                and sum(x is t for x in e.invars) == 1
                and all(x is t or consts.value(x) is not None for x in e.invars)]
    if not foldable:
        return None
    others = [op_name(e) for e in readers if e is not foldable[0]]
    if len(us) > len(readers):
        others.append("the program's output")
    return (f"the value before the {foldable[0].primitive.name} is also read by "
            f"{', '.join(others)}, which need it unscaled; folding would change what they read")


# Views that move elements without arithmetic: a per-channel affine map commutes with them as long
# as we know where the channel axis goes.
MOVES = frozenset({"reshape", "squeeze", "transpose", "broadcast_in_dim"})


def moved_axis(eqn, shape: tuple, fd: int) -> int | None:
    """Where axis ``fd`` of ``shape`` lands after a movement equation, or None (an unknown move,
    or one that mixes channels with other axes)."""
    prim, p = eqn.primitive.name, eqn.params
    if prim not in MOVES or len(eqn.invars) != 1 or len(eqn.outvars) != 1:
        return None
    out = tuple(eqn.outvars[0].aval.shape)
    if prim == "transpose":
        return tuple(p["permutation"]).index(fd)
    if prim == "squeeze":
        dims = tuple(d % len(shape) for d in p["dimensions"])
        return None if fd in dims else fd - sum(d < fd for d in dims)
    if prim == "broadcast_in_dim":
        j = tuple(p["broadcast_dimensions"])[fd]
        return j if out[j] == shape[fd] else None
    if p.get("dimensions") is not None:  # reshape with a transpose first
        return None
    # row-major reshape: channel c stays channel c where the axis keeps its size and stride
    stride = math.prod(shape[fd + 1:])
    for j, n in enumerate(out):
        if n == shape[fd] and math.prod(out[j + 1:]) == stride:
            return j
    return None
