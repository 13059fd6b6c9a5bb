"""Constants known before a program runs: the one rule for computing them, and propagation over a level.

A value is *known* when pure equations compute it from constants and literals alone. Known values
are computed eagerly with JAX on the backend, by the kernels XLA:CPU runs — which read subnormal
floats as zero and flush subnormal results (DAZ/FTZ). XLA's own constant folder, which computes
the constant subgraphs of a jitted program at compile time, does neither (measured on JAX 0.10.2:
``log`` of a subnormal float32 constant is -103.28 under ``jax.jit``, -103.97 through the kernel).
So a value whose arithmetic reads or would produce a subnormal depends on where it is computed;
:func:`fold_equation` refuses it, with the reason, instead of picking one answer. Data moves
(reshape, slice, transpose, ...) copy bits and are computed whatever their values.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal, Var, bind_equation, eval_context
from mlsys_jax.ir import numpy_rules
from mlsys_jax.ir.evaluate import eval_equation
from mlsys_jax.ir.primitives import ELEMENTWISE, LOCAL_MOVEMENT, NAMED_CALLS, PURE
from mlsys_jax.ir.walk import bodies
from mlsys_jax.ir.widen import is_float, widen_value

EVAL_MAX_ELEMENTS = 1 << 24  # never materialise a constant bigger than this for analysis
# Moves that copy bits: a subnormal passes through them unchanged on every backend.
BIT_COPIES = LOCAL_MOVEMENT - {"convert_element_type", "reduce_precision"}


def is_pure(eqn) -> bool:
    """Known pure and deterministic, recursively into call bodies; effectful equations are not."""
    if eqn.effects:
        return False
    name = eqn.primitive.name
    if name in PURE:
        return True
    if name in NAMED_CALLS:  # pure exactly when the body is
        return all(is_pure(e) for b in bodies(eqn) for e in b.jaxpr.eqns)
    return False


def _floats(values) -> list:
    return [a for a in map(np.asarray, values) if is_float(a.dtype)]


def subnormal(a) -> np.ndarray:
    """Where the float array ``a`` holds a subnormal (nonzero, below the dtype's smallest normal)."""
    wide = np.abs(np.asarray(a).astype(np.float64))
    return (wide > 0) & (wide < float(jnp.finfo(a.dtype).tiny))


CHUNK = 1 << 22  # elements widened at a time: a large constant is never copied whole to float64


def _has_subnormal(a) -> bool:
    flat = np.asarray(a).reshape(-1)
    return any(np.any(subnormal(flat[lo:lo + CHUNK])) for lo in range(0, flat.size, CHUNK))


def _flushed(eqn, vals, outs) -> bool:
    """Whether a float output holds a zero that exact arithmetic makes subnormal (a result the
    kernel flushed): the equation again in float64, looked at in the output's dtype."""
    zeros = [a for a in _floats(outs) if a.size and not np.all(a != 0)]
    if not zeros:
        return False
    vals, outs = _at_zeros(eqn, vals, outs)
    try:
        with jax.enable_x64(True), eval_context():  # the float64 meaning of the equation
            wide = eval_equation(eqn, [widen_value(x) for x in vals], widen=True)
    except Exception:  # no float64 meaning (an exotic primitive): not provably flushed
        return False
    for got, exact in zip(outs, wide):
        got = np.asarray(got)
        if not is_float(got.dtype):
            continue
        e = np.abs(np.asarray(exact, np.float64))
        if np.any((got == 0) & (e > 0) & (e < float(jnp.finfo(got.dtype).tiny))):
            return True
    return False


def _at_zeros(eqn, vals, outs) -> tuple:
    """An elementwise equation's inputs and output at the output's zeros alone (the only
    elements :func:`_flushed` looks at; each depends on its own position only), so a large
    constant is not computed again whole in float64; other equations unchanged."""
    if eqn.primitive.name not in ELEMENTWISE or len(outs) != 1:
        return vals, outs
    out = np.asarray(outs[0])
    if not all(np.ndim(x) == 0 or np.shape(x) == out.shape for x in vals):
        return vals, outs
    at = np.flatnonzero(out.reshape(-1) == 0)
    return ([x if np.ndim(x) == 0 else np.asarray(x).reshape(-1)[at] for x in vals],
            [out.reshape(-1)[at]])


def fold_equation(eqn, vals) -> tuple[list | None, str | None]:
    """``eqn`` computed on the known values ``vals``, as XLA:CPU's kernels compute it; or
    ``(None, reason)`` when the result would depend on where it is computed (see the module doc)."""
    name = eqn.primitive.name
    if name not in BIT_COPIES and any(_has_subnormal(a) for a in _floats(vals)):
        return None, (f"{name} reads a subnormal constant: XLA:CPU's kernels read it as zero, its "
                      "constant folder does not, so the result depends on where it is computed")
    outs = numpy_rules.evaluate(eqn, vals)  # XLA's bits without a kernel to compile
    if outs is None:
        with eval_context():  # eagerly, with the kernels eager code shares, whatever is tracing
            outs = bind_equation(eqn, vals)
    if name not in BIT_COPIES and _flushed(eqn, vals, outs):
        return None, (f"{name} of constants gives a subnormal result, which XLA:CPU's kernels flush "
                      "to zero and its constant folder keeps; left to the compiler")
    return outs, None


class Consts:
    """Lazy constant propagation over one jaxpr level: the value of a var computed only from
    consts and literals by pure equations (:func:`fold_equation`, eagerly), else None.

    ``nested``: the level is a body inside a call, whose inputs are the call's arguments.
    ``known``: values already known for some vars (a call's constant arguments)."""

    def __init__(self, jaxpr, consts=(), known: dict | None = None, nested: bool = False):
        self.jaxpr, self.nested = jaxpr, nested
        self.producer = {v: e for e in jaxpr.eqns for v in e.outvars}
        self.memo = dict(zip(jaxpr.constvars, consts))
        self.memo.update(known or {})
        self.invars = set(jaxpr.invars)
        self.why: dict = {}  # var -> why it is not known though its inputs are (fold_equation)

    def value(self, v):
        """The known constant value of a variable or literal as NumPy, or None when it is not constant."""
        if isinstance(v, Literal):
            return np.asarray(v.val, dtype=v.aval.dtype)
        if v in self.memo:
            return self.memo[v]
        out = None
        eqn = self.producer.get(v)
        if (eqn is not None and is_pure(eqn) and v not in self.invars
                and all(math.prod(o.aval.shape) <= EVAL_MAX_ELEMENTS for o in eqn.outvars)):
            ins = [self.value(x) for x in eqn.invars]
            if all(x is not None for x in ins):
                outs, why = fold_equation(eqn, ins)
                if outs is not None:
                    self.memo.update(zip(eqn.outvars, outs))
                    return self.memo[v]
                self.why[v] = why
        self.memo[v] = out
        return out

    def depends_on(self, v, target) -> bool:
        """Whether ``v`` is computed (transitively) from ``target``."""
        seen, stack = set(), [v]
        while stack:
            u = stack.pop()
            if u is target:
                return True
            if isinstance(u, Literal) or u in seen:
                continue
            seen.add(u)
            e = self.producer.get(u)
            if e is not None:
                stack.extend(x for x in e.invars if isinstance(x, Var))
        return False
