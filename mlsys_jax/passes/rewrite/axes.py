"""Where a value's axes come from: the dataflow proof that an operand is "per output feature".

A rule that folds ``scale · linear(x, W) + shift`` must know that ``scale`` and ``shift`` vary
only along the output-feature axes. A shape cannot tell (a bias of C elements broadcast along H
looks like a per-channel bias when H == C), so we read it from the dataflow: an elementwise
operand is usually a broadcast (``broadcast_in_dim``'s ``broadcast_dimensions``) of a smaller
value, perhaps reshaped or squeezed first; :func:`provenance` follows those equations back to the
source and records, for every source axis of size > 1, the axis of the operand it lands on. The
operand varies at most along those axes.

The value being folded also moves (framework code reshapes, squeezes, transposes and broadcasts
between a conv and its BatchNorm): :func:`moved_axes` says where each feature axis goes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlsys_jax.compat import Literal, Var

# Equations that place a value's elements on other axes without arithmetic (convert changes each
# element alone, so it keeps the axes too).
BROADCASTS = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims",
                        "convert_element_type"})
MOVES = frozenset({"reshape", "squeeze", "transpose", "broadcast_in_dim"})


@dataclass(frozen=True)
class Provenance:
    """An operand traced back to its ``source`` (a var or literal): ``axes[i]`` is the operand
    axis that source axis ``i`` lands on (None for a source axis of size 1, broadcast)."""

    source: object
    axes: tuple

    def varies_along(self) -> frozenset:
        """The operand axes along which it may vary (the landing axes of non-unit source axes)."""
        return frozenset(a for a in self.axes if a is not None)


def _unit_map(src_shape, dst_shape) -> list | None:
    """For a reshape that only inserts or removes axes of size 1: each source axis's position in
    the result (None for a unit axis); None when the reshape regroups elements."""
    src = [i for i, n in enumerate(src_shape) if n != 1]
    dst = [j for j, n in enumerate(dst_shape) if n != 1]
    if [src_shape[i] for i in src] != [dst_shape[j] for j in dst]:
        return None
    where = [None] * len(src_shape)
    for i, j in zip(src, dst):
        where[i] = j
    return where


def _step_back(eqn, axes_of_out: tuple):
    """(input atom, its axes) for one broadcast-like equation, given where the output's axes land;
    None when the equation is not one we can see through."""
    prim, p = eqn.primitive.name, eqn.params
    if prim not in BROADCASTS or len(eqn.invars) != 1:
        return None
    src = eqn.invars[0]
    shape = tuple(getattr(src.aval, "shape", ()))
    out_shape = tuple(eqn.outvars[0].aval.shape)
    if prim == "convert_element_type":
        return src, axes_of_out
    if prim == "broadcast_in_dim":
        dims = tuple(p["broadcast_dimensions"])
        return src, tuple(None if shape[i] == 1 else axes_of_out[d] for i, d in enumerate(dims))
    if prim == "squeeze":
        gone = {d % len(shape) for d in p["dimensions"]}
        kept = [i for i in range(len(shape)) if i not in gone]
        where = [None] * len(shape)
        for k, i in enumerate(kept):
            where[i] = axes_of_out[k]
        return src, tuple(where)
    if prim == "reshape" and p.get("dimensions") is not None:
        return None
    where = _unit_map(shape, out_shape)  # reshape / expand_dims that only moves unit axes
    if where is None:
        return None
    return src, tuple(None if w is None else axes_of_out[w] for w in where)


def provenance(producer: dict, v) -> Provenance:
    """Trace operand ``v`` back through broadcasts, unit reshapes, squeezes and converts."""
    shape = tuple(getattr(v.aval, "shape", ()))
    axes = tuple(i if n != 1 else None for i, n in enumerate(shape))
    while isinstance(v, Var) and not isinstance(v, Literal):
        eqn = producer.get(v)
        if eqn is None:
            break
        back = _step_back(eqn, axes)
        if back is None:
            break
        v, axes = back
    return Provenance(v, axes)


def moved_axes(eqn, shape: tuple, features: tuple) -> tuple | None:
    """Where each feature axis of a value of ``shape`` lands after a movement equation, or None
    (an unknown move, or one that mixes a feature axis with others)."""
    prim, p = eqn.primitive.name, eqn.params
    if prim not in MOVES or len(eqn.invars) != 1 or len(eqn.outvars) != 1:
        return None
    out = tuple(eqn.outvars[0].aval.shape)
    if prim == "transpose":
        perm = tuple(p["permutation"])
        return tuple(perm.index(f) for f in features)
    if prim == "squeeze":
        dims = {d % len(shape) for d in p["dimensions"]}
        if dims & set(features):
            return None
        return tuple(f - sum(d < f for d in dims) for f in features)
    if prim == "broadcast_in_dim":
        dims = tuple(p["broadcast_dimensions"])
        moved = tuple(dims[f] for f in features)
        return moved if all(out[m] == shape[f] for m, f in zip(moved, features)) else None
    if p.get("dimensions") is not None:  # reshape with a transpose first
        return None
    moved = []
    for f in features:  # row-major reshape: axis f survives where its size and stride stay
        stride = math.prod(shape[f + 1:])
        hit = [j for j, n in enumerate(out) if n == shape[f] and math.prod(out[j + 1:]) == stride]
        if not hit:
            return None
        moved.append(hit[0])
    return tuple(moved)
