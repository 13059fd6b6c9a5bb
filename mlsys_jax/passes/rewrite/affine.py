"""The affine view of what follows a linear site: ``y = a ⊙ linear(x, W) + b`` per output feature.

From the site's output we follow single-use values through elementwise add/sub/mul/div/neg with a
constant operand (inline ``γ·(z − μ)·rsqrt(σ² + ε) + β`` or ``(z − μ)/√(σ² + ε)·γ + β``), through
named calls whose bodies do only that (``batch_norm``), and through the reshapes, squeezes,
transposes and broadcasts framework code puts in between (equinox vmaps a per-example layer),
composing the map into two feature-shaped vectors (float64, or exact int64). An operand is taken
as per-feature only when its dataflow proves it (``axes.provenance``: it is broadcast along the
feature axes only) or, for a constant, when its values do (equal along every other axis).

The walk stops silently where nothing foldable follows (a relu, a residual add of another tensor);
it stops *with a reason* (:class:`Refuse`, naming the check) where an affine op is in reach but
cannot be folded — batch statistics, an integer division, an operand along another axis, a value
read elsewhere too — so a refusal is never silent. What precedes the stop still folds.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Literal, Var
from mlsys_jax.ir.widen import is_float
from mlsys_jax.ir.opview import op_name
from mlsys_jax.ir.primitives import JIT
from mlsys_jax.passes.rewrite.axes import MOVES, moved_axes, provenance

AFFINE = frozenset({"add", "add_any", "sub", "mul", "div", "neg"})
SHIFTS = frozenset({"add", "add_any", "sub"})
REDUCE = ("reduce_", "argmax", "argmin", "cumsum")
BATCH_STATS = ("BatchNorm statistics must be constants (inference mode); {what} is computed from "
               "the batch (training mode). Freeze the statistics or skip this pass.")


class Stop(Exception):
    """The chain ends here (not an error)."""


class Refuse(Exception):
    """The pattern matched but a precondition failed: ``check`` names it, the message says why."""

    def __init__(self, check: str, reason: str):
        super().__init__(reason)
        self.check = check


def vector_dtype(dtype):
    """The dtype the folded vectors are kept in: float64 for real floats (rounded once, when the
    weights are scaled), int64 for integers (exact: int64 arithmetic wraps modulo 2⁶⁴, so casting
    back wraps exactly as the narrower integer op would). None where folding is not supported."""
    if is_float(dtype):
        return np.dtype(np.float64)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return np.dtype(np.int64)
    return None


@dataclass
class Affine:
    """y = a ⊙ z + b over the feature axes (a, b: feature-shaped NumPy arrays in ``vector_dtype``);
    ``ops`` the kinds of step folded, in order ('scale' or 'shift'), for the log and for rules that
    fold only some signatures."""

    a: object
    b: object
    ops: tuple = ()
    named: str = ""

    @classmethod
    def identity(cls, shape: tuple, dtype) -> "Affine":
        dt = vector_dtype(dtype) or np.dtype(np.float64)
        return cls(np.ones(shape, dt), np.zeros(shape, dt))

    @property
    def steps(self) -> int:
        return len(self.ops)

    def then(self, a, b, prim: str) -> "Affine":
        return Affine(a, b, self.ops + ("shift" if prim in SHIFTS else "scale",), self.named)

    def describe(self) -> str:
        """What was folded, in the words a user looks for."""
        ops = f"{self.steps} op{'s' if self.steps != 1 else ''}"
        if self.named:
            return f"folded {self.named} ({ops})"
        if "scale" in self.ops and "shift" in self.ops:
            return f"folded BatchNorm (per-channel scale and shift, {ops})"
        if "scale" in self.ops:
            return f"folded a per-channel scale ({ops})"
        return f"merged a bias add ({ops})"


@dataclass
class Chain:
    """What follows one site: the affine map, the index of its last folded equation (None:
    nothing to fold), the equations folded (movement views before the last one included), the
    movement equations to replay on the new output, and why the walk stopped at a foldable-looking
    op (``(check, reason)``; None: nothing to report)."""

    aff: Affine
    end: int | None = None
    eqns: list = field(default_factory=list)
    moves: list = field(default_factory=list)
    refusal: tuple | None = None


def feature_vector(level, v, shape: tuple, features: tuple, prim: str, dtype):
    """The value of operand ``v`` of an elementwise op on a value of ``shape`` as a
    feature-shaped vector in ``dtype``; Refuse if it varies along any other axis."""
    val = level.value(v)
    arr = np.asarray(val).astype(dtype)
    if arr.ndim == 0:
        return np.full(tuple(shape[f] for f in features), arr)
    if arr.ndim != len(shape) or any(n not in (1, m) for n, m in zip(arr.shape, shape)):
        raise Stop(f"constant of shape {arr.shape} does not broadcast to {shape}")
    proven = provenance(level.producer, v).varies_along() <= set(features)
    for d in range(arr.ndim):
        if d in features or arr.shape[d] == 1 or proven:
            continue
        if not np.array_equal(arr, np.take(arr, [0], axis=d).repeat(arr.shape[d], axis=d)):
            raise Refuse("per_feature_operand",
                         f"the {prim}'s constant varies along axis {d}, not only along the "
                         f"output-feature axes {features}: it is not a per-feature scale or shift")
    vec = arr[tuple(slice(None) if d in features else 0 for d in range(arr.ndim))]
    vec = np.broadcast_to(vec, tuple(shape[f] for f in sorted(features)))
    order = np.argsort(np.argsort(features))  # vec's axes come in increasing axis order
    return np.transpose(vec, tuple(int(o) for o in order)) if vec.ndim > 1 else vec


def through_reduction(level, v, z) -> bool:
    """Whether ``v`` is computed from ``z`` through a reduction (batch statistics)."""
    stack, seen, reduced = [v], set(), False
    while stack:
        u = stack.pop()
        if isinstance(u, Literal) or u in seen or u is z:
            continue
        seen.add(u)
        e = level.producer.get(u)
        if e is None:
            continue
        if e.primitive.name.startswith(REDUCE) and any(level.consts.depends_on(x, z)
                                                      for x in e.invars if isinstance(x, Var)):
            reduced = True
        stack.extend(x for x in e.invars if isinstance(x, Var))
    return reduced


def operand_refusal(level, v, z, shape, features, what: str) -> tuple | None:
    """Why a non-constant operand ``v`` (``what``) of an affine op on the site's output ``z``
    keeps it from folding, as ``(check, reason)``; None for another full tensor (a residual)."""
    if not isinstance(v, Var):
        return None
    origin = provenance(level.producer, v)
    size = math.prod(getattr(origin.source.aval, "shape", ()))
    if size == math.prod(shape):
        return None  # another full tensor (a residual add): not worth a walk up the graph
    if through_reduction(level, v, z):
        vector = size == math.prod(shape[f] for f in features)
        return ("constant_operand", BATCH_STATS.format(what=what) if vector else (
            f"{what} is computed from the conv output itself, per example (a data-dependent "
            "scale or a per-example normalisation), not a constant"))
    varies = origin.varies_along()
    if not varies <= set(features):
        others = sorted(varies - set(features))
        return ("per_feature_operand",
                f"{what} is broadcast along axis {others[0]}, not only along the output-feature "
                f"axes {features}: it is not a per-feature scale or shift")
    if level.nested:
        return ("constant_operand", f"{what} is an argument of the enclosing call, unknown "
                "inside it: inline the call (the inline pass) to fold")
    return ("constant_operand", f"{what} is computed from the function's inputs, not constant: "
            "trace with the parameters and BatchNorm statistics as constants (closed over) to fold")


def step(level, eqn, t, aff: Affine, shape, features, z) -> Affine:
    """Extend ``aff`` through one elementwise equation consuming the tracked value ``t``."""
    prim = eqn.primitive.name
    if prim not in AFFINE or len(eqn.outvars) != 1 or tuple(eqn.outvars[0].aval.shape) != shape:
        raise Stop(prim)
    if [x is t for x in eqn.invars].count(True) != 1:
        raise Stop(f"{prim} uses the value twice")
    if prim == "neg":
        return aff.then(-aff.a, -aff.b, prim)
    (other,) = [x for x in eqn.invars if x is not t]
    if level.value(other) is None:
        why = operand_refusal(level, other, z, shape, features, f"the {prim} operand")
        if why:
            raise Refuse(*why)
        raise Stop(f"{prim} operand is not a constant")
    dtype = np.dtype(t.aval.dtype)
    vdtype = vector_dtype(dtype)
    if vdtype is None:
        raise Refuse("real_or_integer", f"the output is {dtype}: only real floating-point and "
                     "integer values fold")
    first = eqn.invars[0] is t
    if prim == "div" and not first:
        raise Refuse("affine_in_output", "a constant divided by the output is not affine in it")
    if prim == "div" and vdtype.kind == "i":
        raise Refuse("linear_over_integers", f"{dtype} division truncates, so it is not linear: "
                     "conv(x, W) / c ≠ conv(x, W / c); only exactly linear integer ops (add, sub, "
                     "mul, neg) fold")
    c = feature_vector(level, other, shape, features, prim, vdtype)
    # kept in float64 (or exact int64) and rounded once, when the weights are scaled
    if prim in ("add", "add_any"):
        return aff.then(aff.a, aff.b + c, prim)
    if prim == "sub":
        return aff.then(aff.a, aff.b - c, prim) if first else aff.then(-aff.a, c - aff.b, prim)
    if prim == "mul":
        return aff.then(aff.a * c, aff.b * c, prim)
    return aff.then(aff.a / c, aff.b / c, prim)


def through_call(level, eqn, t, aff: Affine, shape, features, z) -> Affine:
    """Extend ``aff`` through a named call (``batch_norm``) whose body is affine in ``t``."""
    from mlsys_jax.passes.rewrite.level import Level

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
        val = level.value(outer)
        if val is None:
            label = names[j] if j < len(names) else f"argument {j}"
            why = operand_refusal(level, outer, z, shape, features, f"'{label}' of {name}")
            if why:
                raise Refuse(*why)
            raise Stop(f"argument {j} of {name} is not a constant")
        known[v] = val
    body_level = Level(inner, body.consts, known=known, nested=False)
    tracked = inner.invars[k]
    stats = [e for e in inner.eqns if e.primitive.name.startswith(REDUCE)
             and any(body_level.consts.depends_on(x, tracked) for x in e.invars
                     if isinstance(x, Var))]
    if stats:  # jax.nn.standardize, stax.BatchNorm: normalised by the input's own statistics
        what = f"the mean/variance inside '{name}' ({stats[0].primitive.name} over the conv output)"
        if math.prod(stats[0].outvars[0].aval.shape) == math.prod(shape[f] for f in features):
            raise Refuse("constant_operand", BATCH_STATS.format(what=what))
        raise Refuse("constant_operand", f"{what} is computed per example (a per-example "
                     "normalisation), not a constant")
    for e in inner.eqns:
        if any(x is tracked for x in e.invars):
            aff = step(body_level, e, tracked, aff, shape, features, tracked)
            tracked = e.outvars[0]
        elif any(body_level.value(o) is None for o in e.outvars):
            raise Stop("call body does other work")
    if list(inner.outvars) != [tracked]:
        raise Stop("call body output is not the affine value")
    return replace(aff, named="BatchNorm") if name in ("batch_norm", "BatchNorm") else aff


def affine_chain(level, site) -> Chain:
    """Follow the site's output through single-use affine ops, named calls and movement views."""
    z = site.out
    shape, features = tuple(z.aval.shape), site.features
    chain = Chain(Affine.identity(site.feature_shape, z.aval.dtype))
    aff, t, pending = chain.aff, z, []
    while True:
        us = level.users.get(t, [])
        if len(us) != 1 or us[0] < 0:
            chain.refusal = _shared(level, t, us, z, aff, shape, features)
            break
        e = level.eqns[us[0]]
        if e.primitive.name in MOVES:
            moved = moved_axes(e, shape, features)
            if moved is None:
                break
            pending.append(us[0])
            t, shape, features = e.outvars[0], tuple(e.outvars[0].aval.shape), moved
            continue
        try:
            aff = (through_call if e.primitive.name in JIT else step)(level, e, t, aff, shape,
                                                                      features, z)
        except Stop:
            break
        except Refuse as r:
            chain.refusal = (r.check, str(r))
            break
        chain.eqns += pending + [us[0]]
        chain.moves += [level.eqns[i] for i in pending]
        pending = []
        t, chain.end = e.outvars[0], us[0]
    chain.aff = aff
    return chain


def _shared(level, t, us, z, aff: Affine, shape, features) -> tuple | None:
    """Why a value read by several ops (or returned) is not folded further, when one of its
    readers is an affine op we could otherwise fold; None when none is."""
    readers = [level.eqns[u] for u in us if u >= 0]
    # Training-mode BN reads z for its statistics too: name the op that normalises with them
    # (``batch_norm``'s 'mean', an inline sub) before a call that only computes them (``_var``).
    for e in readers:
        if e.primitive.name in AFFINE:
            for o in e.invars:
                why = None if o is t or level.value(o) is not None else operand_refusal(
                    level, o, z, shape, features, f"the {e.primitive.name} operand")
                if why:
                    return why
    calls = [e for e in readers if e.primitive.name in JIT]
    calls.sort(key=lambda e: all(o is t or level.value(o) is not None for o in e.invars))
    for e in calls:  # those reading another traced value (the statistics) first
        try:
            through_call(level, e, t, aff, shape, features, z)
        except Refuse as r:
            return (r.check, str(r))
        except Stop:
            pass
    foldable = [e for e in readers if e.primitive.name in AFFINE and len(e.invars) == 2
                and sum(x is t for x in e.invars) == 1
                and all(x is t or level.value(x) is not None for x in e.invars)]
    if not foldable:
        return None
    others = [op_name(e) for e in readers if e is not foldable[0]]
    if len(us) > len(readers):
        others.append("the program's output")
    return ("single_use", f"the value before the {foldable[0].primitive.name} is also read by "
            f"{', '.join(others)}, which need it unscaled; folding would change what they read")
