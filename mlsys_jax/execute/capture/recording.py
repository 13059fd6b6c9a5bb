"""The recording half of graph-break capture: a JAX trace whose tracers defer every primitive.

Lecture §8.4: TorchDynamo records tensor operations into an FX graph and *breaks* the graph where
Python needs a concrete value. Here the same happens one level down, on JAX's own tracing
machinery: user code runs with :class:`RecordTrace` as the current trace, so every
``Primitive.bind`` lands in :meth:`RecordTrace.process_primitive`, which appends an equation to
the pending segment and returns a :class:`DeferredTracer`. A tracer's ``__bool__``, ``__int__``,
``__float__``, ``__index__``, ``__array__``, ``item``, ``tolist`` and printing call back into the
run (``guard_tree.py``), which compiles and executes the pending segment and returns the concrete
value — a graph break.

One recorded equation is one *eager dispatch*: a primitive, or a whole ``jit`` call (``jnp``
helpers are ``jit(inline=True)``, a user's ``@jax.jit`` function is not), exactly the unit eager
JAX compiles and runs on its own; ``dispatch_units.py`` says which of them exact replay runs alone.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import jax

from mlsys_jax.compat import (Trace, Tracer, cached_abstract_eval, debug_effects, eval_trace,
                              set_current_trace)
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute.capture.dispatch_units import PLAIN, Traits, classify, folds_repeated
from mlsys_jax.execute.capture.watching import untraced


@dataclass(frozen=True)
class Eqn:
    """One recorded dispatch: ``ins`` are slots (>= 0) or constants (-1 - index).

    ``traits`` (``dispatch_units.py``): whether exact mode runs it as its own XLA program, how many
    primitives it holds, and what XLA's fusion could do to it.
    """

    prim: Any
    params: dict
    ins: tuple
    outs: tuple
    traits: Traits = PLAIN


def _breaks(kind: str):
    """A DeferredTracer method that breaks the graph with ``kind`` (its arguments passed on)."""
    def method(self, *extra):
        return self._concrete(kind, *extra)
    method.__name__ = kind
    return method


class DeferredTracer(Tracer):
    """A value that exists only as a slot in a segment until Python asks for it (a graph break)."""

    __slots__ = ["slot", "val"]

    def __init__(self, trace, aval, slot):
        super().__init__(trace, aval)
        self.slot = slot
        self.val = None  # the concrete array once the segment that makes it has run

    # Never tell JAX a value (even a materialized one): JAX probes this opportunistically and
    # would take value-dependent paths that no guard records. Breaks go through the dunders below.
    def to_concrete_value(self):
        """Always None: a value JAX took here would steer it down paths no guard records."""
        return None

    def _concrete(self, kind, *extra):
        return self._trace.run.graph_break(self, kind, *extra)

    # Every way Python asks a value for its contents is a graph break of that kind.
    __bool__, __int__, __float__, __complex__, __index__ = (
        _breaks(k) for k in ("bool", "int", "float", "complex", "index"))
    item, tolist, __str__, __repr__, __format__ = (
        _breaks(k) for k in ("item", "tolist", "str", "repr", "format"))

    def __array__(self, dtype=None, copy=None):
        out = self._concrete("array")
        return out if dtype is None else out.astype(dtype)


class RecordTrace(Trace):
    """The current trace while captured Python runs: records primitives instead of running them."""

    def __init__(self, run):
        super().__init__()
        self.requires_low = False
        self.run = run

    def _checked(self, args):
        for a in args:
            if isinstance(a, Tracer) and a._trace is not self:
                if isinstance(a, DeferredTracer):
                    raise MlsysError(
                        "capture: a deferred value from an earlier call was used again (it was "
                        "kept outside the function, e.g. in a global or a closure). A captured "
                        "function must be pure: return values instead of storing them.")
                raise MlsysError(
                    f"capture: got a {type(a).__name__} from another JAX transformation. Apply "
                    "jax.grad/vmap/jit inside the captured function, not around it.")
        return args

    def process_primitive(self, prim, args, params):
        """Record a primitive instead of running it (capture's own work, unwatched)."""
        return untraced(self._record, prim, args, params)  # capture's own work: unwatched

    def _record(self, prim, args, params):
        args = self._checked(args)
        avals = [a.aval if isinstance(a, DeferredTracer) else jax.typeof(a) for a in args]
        out_avals, effects = cached_abstract_eval(prim, *avals, **params)
        unreplayable = [e for e in effects if e not in debug_effects]
        if unreplayable:
            raise MlsysError(
                f"capture: primitive '{prim.name}' has side effects {unreplayable} that compiled "
                "segments cannot replay faithfully. Remove it from the captured function, or run "
                "the function eagerly (or under jax.jit).")
        if not effects and not any(isinstance(a, DeferredTracer) for a in args):
            # Constants only (a Python scalar's convert, jnp.ones, a PRNG key): run now, as eager.
            with set_current_trace(eval_trace):
                return prim.bind(*args, **params)
        multiple = prim.multiple_results
        traits = classify(prim, params, avals)
        if len({id(a) for a in args}) < len(args) and folds_repeated(prim, params):
            traits = Traits(True, traits.size)  # eager's own program, the operands two parameters
        outs = self.run.record(prim, params, args, out_avals if multiple else [out_avals],
                               traits)
        return outs if multiple else outs[0]

    def stage_value(self, val):
        """Keep a deferred value deferred; make anything else an array now, as eager JAX does."""
        # jnp.asarray / jnp.array of a value: a deferred value stays deferred; anything else is
        # made an array now, as eager does.
        if isinstance(val, DeferredTracer) and val._trace is self:
            return val
        with set_current_trace(eval_trace):
            return untraced(eval_trace.stage_value, self._checked([val])[0])

    def process_custom_jvp_call(self, prim, fun, jvp, tracers, *, symbolic_zeros):
        """Record the function's own body: segments are evaluated, never differentiated."""
        # Segments are only evaluated (never differentiated), so the custom rule is not needed;
        # eager evaluation runs ``fun`` op by op too.
        del prim, jvp, symbolic_zeros
        with set_current_trace(self):
            return fun.call_wrapped(*self._checked(tracers))

    def process_custom_vjp_call(self, prim, fun, fwd, bwd, tracers, *, out_trees, symbolic_zeros):
        """Record the function's own body: segments are evaluated, never differentiated."""
        del prim, fwd, bwd, out_trees, symbolic_zeros
        with set_current_trace(self):
            return fun.call_wrapped(*self._checked(tracers))

    def process_call(self, prim, f, tracers, params):
        """Record a call's body inline, op by op, as eager evaluation runs it."""
        del prim, params
        with set_current_trace(self):
            return f.call_wrapped(*self._checked(tracers))

    def process_map(self, prim, f, tracers, params):
        """Refuse ``jax.pmap`` inside a captured function, naming the alternatives."""
        raise MlsysError(
            f"capture: {prim.name} (jax.pmap) inside a captured function is not supported; use "
            "jax.shard_map inside it, or call the function eagerly")


def user_frame() -> str:
    """``file:line: source`` of the innermost frame outside JAX and this package (a break's site)."""
    import linecache

    frame = sys._getframe(1)
    skip = ("/jax/", "/jaxlib/", "/mlsys_jax/execute/", "/numpy/")
    while frame is not None and any(s in frame.f_code.co_filename for s in skip):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"{frame.f_code.co_filename}:{frame.f_lineno}: {code}"
