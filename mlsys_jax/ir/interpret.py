"""Evaluating and rebuilding jaxprs by re-tracing an interpreter.

:func:`rebuild` binds each equation again under ``jax.make_jaxpr`` (optionally through a
handler), so params, literals, effects and weak types come out as JAX makes them. The passes do
not re-trace whole jaxprs: they copy JAX's equations and trace only what is new (``ir.edit``).
Nothing in mlsys_jax builds an equation by hand.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import jax

from mlsys_jax.compat import ClosedJaxpr, Jaxpr, Literal, bind_equation
from mlsys_jax.ir.trace import input_structs

# handler(eqn, invals) -> list of outvals, or None to bind the equation unchanged.
Handler = Callable[[object, list], Optional[Sequence]]


def eval_jaxpr(jaxpr: Jaxpr, consts: Sequence, *args, handler: Handler | None = None) -> list:
    """Evaluate an open jaxpr equation by equation (traceable: works under make_jaxpr and jit)."""
    if len(args) != len(jaxpr.invars):
        raise TypeError(f"jaxpr takes {len(jaxpr.invars)} inputs, got {len(args)}")
    env: dict = {}

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    env.update(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        outs = handler(eqn, invals) if handler is not None else None
        if outs is None:
            outs = bind_equation(eqn, invals)
        if len(outs) != len(eqn.outvars):
            raise ValueError(f"handler for {eqn.primitive.name} returned {len(outs)} values, "
                             f"expected {len(eqn.outvars)}")
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def interpret(closed: ClosedJaxpr, *args, handler: Handler | None = None) -> list:
    """Run a ClosedJaxpr on flat arguments; returns the flat list of outputs."""
    return eval_jaxpr(closed.jaxpr, closed.consts, *args, handler=handler)


def rebuild(closed: ClosedJaxpr, handler: Handler | None = None) -> ClosedJaxpr:
    """Re-trace ``closed`` through :func:`interpret` (optionally rewriting equations).

    ``rebuild(trace(f))`` computes bit-for-bit what ``f`` computes; input avals (weak_type
    included) and effects are preserved.
    """
    return jax.make_jaxpr(lambda *a: interpret(closed, *a, handler=handler))(*input_structs(closed))


def as_function(closed: ClosedJaxpr) -> Callable:
    """A Python function ``f(*flat_args) -> list`` evaluating ``closed`` (jit-able)."""
    return lambda *args: interpret(closed, *args)


LIFT_BYTES = 1 << 20  # constants at least this large enter compiled programs as arguments


def lifted(closed: ClosedJaxpr, min_bytes: int = LIFT_BYTES) -> tuple[Callable, list]:
    """``(fn, big)`` such that ``fn(big, *flat_args)`` evaluates ``closed`` like
    :func:`as_function`, with its constants of at least ``min_bytes`` bytes passed in as ``big``
    instead of closed over. Under ``jax.jit`` a closed-over constant is copied into the program
    (MLIR, the compilation cache key's hash, XLA's constant folding: seconds and several copies
    per 100 MB); an argument is read where it lies. Smaller constants stay in the program, where
    XLA folds them as it would in the user's own jitted code."""
    def fn(values, *args):
        return eval_jaxpr(closed.jaxpr, with_lifted(closed, values, min_bytes), *args)
    return fn, [closed.consts[i] for i in lifted_indices(closed, min_bytes)]


def with_lifted(closed: ClosedJaxpr, values, min_bytes: int = LIFT_BYTES) -> list:
    """The constants of ``closed``, those :func:`lifted` passes in replaced by ``values``."""
    full = list(closed.consts)
    for i, x in zip(lifted_indices(closed, min_bytes), values):
        full[i] = x
    return full


def lifted_indices(closed: ClosedJaxpr, min_bytes: int = LIFT_BYTES) -> list[int]:
    """Indices of the constants of ``closed`` that :func:`lifted` passes in as arguments."""
    from mlsys_jax.ir.trace import aval_bytes

    return [i for i, (v, c) in enumerate(zip(closed.jaxpr.constvars, closed.consts))
            if hasattr(c, "shape") and aval_bytes(v.aval) >= min_bytes]
