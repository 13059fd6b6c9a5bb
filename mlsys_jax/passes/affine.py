"""Recognising ``scale * conv(x, W) + shift`` per output channel, however BatchNorm is written.

We follow the conv output through elementwise add/sub/mul/div/neg with constant operands (inline
``gamma * (z - mean) * rsqrt(var + eps) + beta`` or ``(z - mean) / sqrt(var + eps) * gamma + beta``),
through named calls whose bodies do only that (``batch_norm``), and through the reshapes, squeezes,
transposes and broadcasts that framework code puts in between (equinox vmaps a per-example
``Conv2d``), keeping the composite affine map as two per-channel vectors. §4.1 rule (1) then folds
it: W' = W·s, B' = (B − μ)·s + β. The walk itself (and the movement views) is
``passes/bnchain.py``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Literal, Var
from mlsys_jax.passes.convsites import Consts

AFFINE = frozenset({"add", "add_any", "sub", "mul", "div", "neg"})
SHIFTS = frozenset({"add", "add_any", "sub"})
REDUCE = ("reduce_", "argmax", "argmin", "cumsum")


class Stop(Exception):
    """The chain ends here (not an error)."""


class Refuse(Exception):
    """The pattern matched but a precondition failed; the message is the reason."""


def vector_dtype(dtype):
    """The dtype the folded vectors are kept in: float64 for real floats (rounded once, when the
    weights are scaled), int64 for integers (exact: int64 arithmetic wraps modulo 2⁶⁴, so casting
    back wraps exactly as the narrower integer op would). None where folding is not supported."""
    if jnp.issubdtype(dtype, jnp.floating):  # float16/32/64 and ml_dtypes' bfloat16, float8s
        return np.dtype(np.float64)
    if jnp.issubdtype(dtype, jnp.integer):
        return np.dtype(np.int64)
    return None


@dataclass
class Affine:
    """y = a ⊙ z + b along the output-feature axis (a, b: (C,) NumPy vectors in ``vector_dtype``),
    with what kinds of op it folds (for the log: a bias merge is not a BatchNorm fold)."""

    a: object
    b: object
    steps: int = 0
    scaled: bool = False
    shifted: bool = False
    named: str = ""

    @classmethod
    def identity(cls, channels: int, dtype) -> "Affine":
        dt = vector_dtype(dtype) or np.dtype(np.float64)
        return cls(np.ones((channels,), dt), np.zeros((channels,), dt))

    def then(self, a, b, prim: str) -> "Affine":
        return Affine(a, b, self.steps + 1, self.scaled or prim not in SHIFTS,
                      self.shifted or prim in SHIFTS, self.named)

    def describe(self) -> str:
        """What was folded, in the words a user looks for."""
        ops = f"{self.steps} op{'s' if self.steps != 1 else ''}"
        if self.named:
            return f"folded {self.named} ({ops})"
        if self.scaled and self.shifted:
            return f"folded BatchNorm (per-channel scale and shift, {ops})"
        if self.scaled:
            return f"folded a per-channel scale ({ops})"
        return f"merged a bias add ({ops})"


def per_channel(c, shape: tuple, fd: int, dtype, prim: str):
    """A constant as a (C,) vector along axis ``fd`` of ``shape``; Refuse if it varies elsewhere.

    (A structural check on a known value; NumPy avoids compiling a kernel per shape.)"""
    arr = np.asarray(c).astype(dtype)
    C = shape[fd]
    if arr.ndim == 0:
        return np.full((C,), arr)
    if arr.ndim != len(shape):
        raise Stop(f"constant of shape {arr.shape} does not broadcast along the feature axis only")
    for d in range(arr.ndim):
        if d != fd and arr.shape[d] > 1 and not np.array_equal(arr, np.take(arr, [0], axis=d)
                                                                .repeat(arr.shape[d], axis=d)):
            raise Refuse(f"the {prim}'s constant varies along axis {d}, not only along the "
                         f"output-feature axis {fd}: it is not a per-channel scale or shift")
    vec = arr[tuple(slice(None) if d == fd else 0 for d in range(arr.ndim))]
    return np.broadcast_to(vec, (C,))


def through_reduction(consts: Consts, v, z) -> bool:
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


BATCH_STATS = ("BatchNorm statistics must be constants (inference mode); {what} is computed from "
               "the batch (training mode). Freeze the statistics or skip this pass.")


def step(eqn, t, consts: Consts, aff: Affine, shape, fd, z) -> Affine:
    """Extend ``aff`` through one elementwise equation consuming the tracked value ``t``."""
    prim = eqn.primitive.name
    if prim not in AFFINE or len(eqn.outvars) != 1 or eqn.outvars[0].aval.shape != shape:
        raise Stop(prim)
    if [x is t for x in eqn.invars].count(True) != 1:
        raise Stop(f"{prim} uses the value twice")
    if prim == "neg":
        return aff.then(-aff.a, -aff.b, prim)
    (other,) = [x for x in eqn.invars if x is not t]
    val = consts.value(other)
    if val is None:
        why = operand_refusal(consts, other, z, shape, fd, f"the {prim} operand")
        if why:
            raise Refuse(why)
        raise Stop(f"{prim} operand is not a constant")
    dtype = np.dtype(t.aval.dtype)
    vdtype = vector_dtype(dtype)
    if vdtype is None:
        raise Refuse(f"the conv output is {dtype}: only real floating-point and integer convs fold")
    first = eqn.invars[0] is t
    if prim == "div" and not first:
        raise Refuse("a constant divided by the conv output is not affine in it")
    if prim == "div" and vdtype.kind == "i":
        raise Refuse(f"{dtype} division truncates, so it is not linear: conv(x, W) / c ≠ "
                     "conv(x, W / c); only exactly linear integer ops (add, sub, mul, neg) fold")
    c = per_channel(val, shape, fd, vdtype, prim)
    # The composite map is kept in float64 (or exact int64) and rounded once, when the weights
    # are scaled.
    if prim in ("add", "add_any"):
        return aff.then(aff.a, aff.b + c, prim)
    if prim == "sub":
        return aff.then(aff.a, aff.b - c, prim) if first else aff.then(-aff.a, c - aff.b, prim)
    if prim == "mul":
        return aff.then(aff.a * c, aff.b * c, prim)
    return aff.then(aff.a / c, aff.b / c, prim)


def _channel_vector(consts: Consts, v, shape, fd) -> bool:
    """Whether ``v`` is a per-channel vector, maybe broadcast along the other axes (a BatchNorm
    parameter or statistic), not a full tensor (a residual, a per-example gate)."""
    while isinstance(v, Var):
        size = math.prod(v.aval.shape)
        if size == shape[fd]:
            return size > 1 and (v.aval.ndim <= 1 or (v.aval.ndim == len(shape)
                                                      and v.aval.shape[fd] == size))
        e = consts.producer.get(v)
        if e is None or e.primitive.name not in ("broadcast_in_dim", "reshape",
                                                 "convert_element_type"):
            return False
        v = e.invars[0]
    return False


def operand_refusal(consts: Consts, v, z, shape, fd, what: str) -> str | None:
    """Why a non-constant operand ``v`` (``what``) of an affine op on the conv output ``z`` keeps
    it from folding, when the op looks foldable; None for another full tensor (a residual add)."""
    if not isinstance(v, Var):
        return None
    e = consts.producer.get(v)
    if tuple(v.aval.shape) == tuple(shape) and (e is None or e.primitive.name != "broadcast_in_dim"):
        return None  # another full tensor (a residual add): not worth a walk up the graph
    vector = _channel_vector(consts, v, shape, fd)
    if through_reduction(consts, v, z):
        return BATCH_STATS.format(what=what) if vector else (
            f"{what} is computed from the conv output itself, per example (a data-dependent "
            "scale or a per-example normalisation), not a constant")
    if not vector:
        return None
    if consts.nested:
        return (f"{what} is an argument of the enclosing call, unknown inside it: inline the "
                "call (the inline pass) to fold")
    return (f"{what} is computed from the function's inputs, not constant: trace with the "
            "parameters and BatchNorm statistics as constants (closed over) to fold")


def through_call(eqn, t, consts: Consts, aff: Affine, shape, fd, z) -> Affine:
    """Extend ``aff`` through a named call (``batch_norm``) whose body is affine in ``t``."""
    body = eqn.params.get("jaxpr")
    name = eqn.params.get("name") or eqn.primitive.name
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
            label = names[j] if j < len(names) else f"argument {j}"
            why = operand_refusal(consts, outer, z, shape, fd, f"'{label}' of {name}")
            if why:
                raise Refuse(why)
            raise Stop(f"argument {j} of {name} is not a constant")
        known[v] = val
    inner_consts = Consts(inner, body.consts, known)
    tracked = inner.invars[k]
    stats = [e for e in inner.eqns if e.primitive.name.startswith(REDUCE)
             and any(inner_consts.depends_on(x, tracked) for x in e.invars if isinstance(x, Var))]
    if stats:  # jax.nn.standardize, stax.BatchNorm: normalised by the input's own statistics
        what = f"the mean/variance inside '{name}' ({stats[0].primitive.name} over the conv output)"
        if math.prod(stats[0].outvars[0].aval.shape) == shape[fd]:  # one per channel: batch stats
            raise Refuse(BATCH_STATS.format(what=what))
        raise Refuse(f"{what} is computed per example (a per-example normalisation), not a "
                     "constant")
    for e in inner.eqns:
        if any(x is tracked for x in e.invars):
            aff = step(e, tracked, inner_consts, aff, shape, fd, tracked)
            tracked = e.outvars[0]
        elif any(inner_consts.value(o) is None for o in e.outvars):
            raise Stop("call body does other work")
    if list(inner.outvars) != [tracked]:
        raise Stop("call body output is not the affine value")
    return replace(aff, named="BatchNorm") if name in ("batch_norm", "BatchNorm") else aff
