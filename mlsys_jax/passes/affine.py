"""Recognising ``scale * conv(x, W) + shift`` per output channel, however BatchNorm is written.

We follow the conv output through elementwise add/sub/mul/div/neg with constant operands (inline
``gamma * (z - mean) * rsqrt(var + eps) + beta`` or ``(z - mean) / sqrt(var + eps) * gamma + beta``)
and through named calls whose bodies do only that (``batch_norm``), keeping the composite affine map
as two per-channel vectors. §4.1 rule (1) then folds it: W' = W·s, B' = (B − μ)·s + β.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Literal, Var
from mlsys_jax.ir.primitives import JIT
from mlsys_jax.passes.convsites import Consts, Site

AFFINE = frozenset({"add", "add_any", "sub", "mul", "div", "neg"})
REDUCE = ("reduce_", "argmax", "argmin", "cumsum")


class Stop(Exception):
    """The chain ends here (not an error)."""


class Refuse(Exception):
    """The pattern matched but a precondition failed; the message is the reason."""


@dataclass
class Affine:
    """y = a ⊙ z + b along the output-feature axis (a, b: (C,) float64 NumPy vectors)."""

    a: object
    b: object
    steps: int = 0


def per_channel(c, shape: tuple, fd: int):
    """A constant as a (C,) vector along axis ``fd`` of ``shape``; Stop if it varies elsewhere.

    (A structural check on a known value; NumPy avoids compiling a kernel per shape.)"""
    arr = np.asarray(c, dtype=np.float64)
    C = shape[fd]
    if arr.ndim == 0:
        return np.full((C,), arr)
    if arr.ndim != len(shape):
        raise Stop(f"constant of shape {arr.shape} does not broadcast along the feature axis only")
    for d in range(arr.ndim):
        if d != fd and arr.shape[d] > 1 and not np.array_equal(arr, np.take(arr, [0], axis=d)
                                                                .repeat(arr.shape[d], axis=d)):
            raise Stop(f"constant varies along axis {d}, not only the output-feature axis {fd}")
    vec = arr[tuple(slice(None) if d == fd else 0 for d in range(arr.ndim))]
    return np.broadcast_to(vec, (C,))


def _through_reduction(consts: Consts, v, z) -> bool:
    """Whether ``v`` is computed from ``z`` through a reduction (batch statistics)."""
    stack, seen, reduced = [v], set(), False
    while stack:
        u = stack.pop()
        if isinstance(u, Literal) or u in seen or u is z:
            continue
        seen.add(u)
        e = consts.producer.get(u)
        if e is None:
            continue
        if e.primitive.name.startswith(REDUCE) and any(consts.depends_on(x, z) for x in e.invars
                                                     if isinstance(x, Var)):
            reduced = True
        stack.extend(x for x in e.invars if isinstance(x, Var))
    return reduced


def step(eqn, t, consts: Consts, aff: Affine, shape, fd, z, name_of=None) -> Affine:
    """Extend ``aff`` through one elementwise equation consuming the tracked value ``t``."""
    prim = eqn.primitive.name
    if prim not in AFFINE or len(eqn.outvars) != 1 or eqn.outvars[0].aval.shape != shape:
        raise Stop(prim)
    if [x is t for x in eqn.invars].count(True) != 1:
        raise Stop(f"{prim} uses the value twice")
    if prim == "neg":
        return Affine(-aff.a, -aff.b, aff.steps + 1)
    (other,) = [x for x in eqn.invars if x is not t]
    val = consts.value(other)
    if val is None:
        if isinstance(other, Var) and _through_reduction(consts, other, z):
            label = name_of(other) if name_of else None
            what = f"'{label}'" if label else f"the {prim} operand"
            raise Refuse(f"BatchNorm statistics must be constants (inference mode); {what} is "
                         "computed from the batch. Freeze the statistics or skip this pass.")
        raise Stop(f"{prim} operand is not a constant")
    c = per_channel(val, shape, fd)
    first = eqn.invars[0] is t
    # The composite map is kept in float64 and rounded once, when the weights are scaled.
    if prim in ("add", "add_any"):
        return Affine(aff.a, aff.b + c, aff.steps + 1)
    if prim == "sub":
        return (Affine(aff.a, aff.b - c, aff.steps + 1) if first
                else Affine(-aff.a, c - aff.b, aff.steps + 1))
    if prim == "mul":
        return Affine(aff.a * c, aff.b * c, aff.steps + 1)
    if not first:
        raise Stop("division by the conv output is not affine")
    return Affine(aff.a / c, aff.b / c, aff.steps + 1)


def through_call(eqn, t, consts: Consts, aff: Affine, shape, fd, z) -> Affine:
    """Extend ``aff`` through a named call (``batch_norm``) whose body is affine in ``t``."""
    body = eqn.params.get("jaxpr")
    if not isinstance(body, ClosedJaxpr) or len(eqn.outvars) != 1 or body.effects:
        raise Stop(eqn.primitive.name)
    if [x is t for x in eqn.invars].count(True) != 1:
        raise Stop("call uses the value twice")
    k = [x is t for x in eqn.invars].index(True)
    info = getattr(body.jaxpr, "debug_info", None)
    names = list(getattr(info, "arg_names", None) or [])
    known, inner = {}, body.jaxpr
    for j, (outer, v) in enumerate(zip(eqn.invars, inner.invars)):
        if j == k:
            continue
        val = consts.value(outer)
        if val is None:
            if isinstance(outer, Var) and _through_reduction(consts, outer, z):
                label = names[j] if j < len(names) else f"argument {j}"
                raise Refuse(f"BatchNorm statistics must be constants (inference mode); "
                             f"'{label}' of {eqn.params.get('name')} is computed from the batch. "
                             "Freeze the statistics or skip this pass.")
            raise Stop(f"argument {j} of {eqn.params.get('name')} is not a constant")
        known[v] = val
    inner_consts = Consts(inner, body.consts, known)
    tracked = inner.invars[k]
    for e in inner.eqns:
        if any(x is tracked for x in e.invars):
            aff = step(e, tracked, inner_consts, aff, shape, fd, tracked)
            tracked = e.outvars[0]
        elif any(inner_consts.value(o) is None for o in e.outvars):
            raise Stop("call body does other work")
    if list(inner.outvars) != [tracked]:
        raise Stop("call body output is not the affine value")
    return aff


def affine_chain(jaxpr, consts: Consts, site: Site, users: dict):
    """Follow the conv output through single-use affine ops and calls.

    Returns (Affine, index of the last equation of the chain) or None; raises Refuse."""
    z = site.out
    shape, fd = z.aval.shape, site.feature_dim
    aff = Affine(np.ones((shape[fd],)), np.zeros((shape[fd],)))
    t, end = z, None
    while True:
        us = users.get(t, [])
        if len(us) != 1 or us[0] < 0:
            for u in us:  # several users: training-mode BN reads z for its statistics too
                e = jaxpr.eqns[u] if u >= 0 else None
                if e is not None and e.primitive.name in JIT:
                    try:
                        through_call(e, t, consts, aff, shape, fd, z)  # raises Refuse
                    except Stop:
                        pass
                if e is not None and e.primitive.name in ("sub", "div", "mul", "add"):
                    for o in e.invars:
                        if o is not t and isinstance(o, Var) and consts.value(o) is None \
                                and _through_reduction(consts, o, z):
                            raise Refuse("BatchNorm statistics must be constants (inference "
                                         "mode); the mean/variance are computed from the batch. "
                                         "Freeze the statistics or skip this pass.")
            break
        e = jaxpr.eqns[us[0]]
        try:
            if e.primitive.name in JIT:
                aff = through_call(e, t, consts, aff, shape, fd, z)
            else:
                aff = step(e, t, consts, aff, shape, fd, z)
        except Stop:
            break
        t, end = e.outvars[0], us[0]
    if end is None:
        return None
    finite = bool(np.isfinite(np.asarray(aff.a)).all() and np.isfinite(np.asarray(aff.b)).all())
    if not finite:
        raise Refuse("the folded scale or shift is not finite (BatchNorm var + eps ≤ 0?); "
                     "left as it was")
    return aff, end
