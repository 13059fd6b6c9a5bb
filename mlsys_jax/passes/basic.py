"""Structural passes: dce, cse, fold_constants, inline (TensorFlow's graph-level clean-ups, §8.1).

Each is a factory returning a named :class:`Pass`; options exist so a fuzzer can build deliberately
broken variants (TESTING.md §4) — e.g. ``cse(param_blind=True)`` or ``fold_constants(keep_weak=False)``.
"""
from __future__ import annotations

import math

import jax

from mlsys_jax.compat import ClosedJaxpr, Literal, bind_equation, dce_jaxpr_consts
from mlsys_jax.ir import eval_jaxpr, input_structs, interpret
from mlsys_jax.ir.keys import params_key, value_key
from mlsys_jax.ir.primitives import PLAIN_CALLS
from mlsys_jax.ir.walk import bodies, body_path, walk
from mlsys_jax.passes.core import (Log, Pass, PassResult, default_outputs, is_concrete, is_pure,
                                   simple_pass)

FOLD_MAX_ELEMENTS = 1024  # a folded value may exceed its largest input only up to this size


# ---- dce ------------------------------------------------------------------------------------

def dce_jaxpr(closed: ClosedJaxpr) -> ClosedJaxpr:
    """Remove equations no output needs (JAX's own DCE rules: effects kept, bodies pruned)."""
    n = len(closed.jaxpr.constvars)
    new, used_consts, _ = dce_jaxpr_consts(closed.jaxpr, [True] * len(closed.jaxpr.outvars),
                                           instantiate=[False] * n + [True] * len(closed.jaxpr.invars))
    consts = [c for c, u in zip(closed.consts, used_consts) if u]
    return ClosedJaxpr(new, consts)


def _count(closed) -> int:
    return sum(1 for _ in walk(closed))


def dce() -> Pass:
    """Dead-code elimination: keep only what the outputs need, and every effectful equation."""
    def fn(closed):
        new = dce_jaxpr(closed)
        removed = _count(closed) - _count(new)
        if removed == 0 and len(new.consts) == len(closed.consts):
            return PassResult(closed, False)
        log = Log("dce")
        log.fired("", f"removed {removed} dead equation(s)")
        return PassResult(new, True, tuple(log.rewrites))
    return Pass("dce", fn)


def prune_outputs(closed: ClosedJaxpr, keep) -> ClosedJaxpr:
    """Partial execution (§8.1): a jaxpr computing only outputs ``keep`` (indices), and only what
    they need; effects are kept."""
    keep = list(keep)
    sub = jax.make_jaxpr(lambda *a: [interpret(closed, *a)[i] for i in keep])(
        *input_structs(closed))
    return dce_jaxpr(sub)


# ---- cse ------------------------------------------------------------------------------------

def cse(param_blind: bool = False) -> Pass:
    """Common-subexpression elimination: merge pure equations with the same primitive, params and
    inputs (literals keyed by value, dtype and weak_type; params by ``ir.keys`` at full strictness:
    bodies by structure, rules and other functions by identity). Effectful, opaque (unknown) and
    remat-protected (``prevent_cse``) equations are never merged."""
    def make_rule(closed, log, path):
        rep: dict = {}     # original var -> representative original var
        table: dict = {}   # key -> (outputs, path)

        def canon(v):
            if isinstance(v, Literal):
                return value_key(v.val, v.aval)
            return id(rep.get(v, v))

        def rule(i, eqn, invals, lookup, here):
            if not is_pure(eqn) or eqn.params.get("prevent_cse"):
                return None
            params = "" if param_blind else params_key(eqn.params, strict=True)
            key = (eqn.primitive.name, params, tuple(canon(v) for v in eqn.invars))
            if key in table:
                outs, first, first_vars = table[key]
                rep.update(zip(eqn.outvars, first_vars))
                log.fired(here, f"{eqn.primitive.name} = equation {first}")
                return outs
            outs = default_outputs(eqn, invals, make_rule, log, here)  # CSE inside bodies too
            table[key] = (outs, here, eqn.outvars)
            return outs
        return rule
    return simple_pass("cse", make_rule)


# ---- fold_constants --------------------------------------------------------------------------

def _size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ()) or ()))


def fold_constants(max_elements: int = FOLD_MAX_ELEMENTS, keep_weak: bool = True) -> Pass:
    """Evaluate pure equations whose inputs are all constants, with JAX on the same backend (XLA:CPU
    flushes subnormals; NumPy would not). Zero-input producers (iota, a broadcast literal) are
    never expanded into a constant bigger than ``max_elements`` or than their largest input."""
    def make_rule(closed, log, path):
        def rule(i, eqn, invals, lookup, here):
            if not eqn.invars or not is_pure(eqn) or not all(map(is_concrete, invals)):
                return None
            biggest = max(_size(v.aval) for v in eqn.invars)
            if any(_size(v.aval) > max(biggest, max_elements) for v in eqn.outvars):
                return None
            with jax.ensure_compile_time_eval():
                outs = bind_equation(eqn, invals)
                if not keep_weak:  # a deliberately broken variant for mutation testing
                    outs = [jax.numpy.array(o, dtype=o.dtype) for o in outs]
            log.fired(here, eqn.primitive.name)
            return outs
        return rule
    return simple_pass("fold_constants", make_rule, cleanup=dce_jaxpr)


# ---- inline ----------------------------------------------------------------------------------

def inline(names=None) -> Pass:
    """Inline named calls (``jit[name=...]``) into their parent, recursively, so rules that match
    primitives can see them. custom_jvp/vjp calls stay calls: inlining would drop their derivative
    rules and change gradients (e.g. relu's at 0)."""
    wanted = None if names is None else frozenset([names] if isinstance(names, str) else names)

    def make_rule(closed, log, path):
        def rule(i, eqn, invals, lookup, here):
            if eqn.primitive.name not in PLAIN_CALLS:
                return None
            name = eqn.params.get("name")
            if wanted is not None and name not in wanted:
                return None
            body = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            if not isinstance(body, ClosedJaxpr) or body.effects:
                return None  # keep effectful calls as calls: order and effects stay explicit
            log.fired(here, f"inlined {name}")
            inner = body_path(here, bodies(eqn)[0])  # calls inside are logged at their own path
            index = {id(e): j for j, e in enumerate(body.jaxpr.eqns)}
            return eval_jaxpr(body.jaxpr, body.consts, *invals, handler=lambda e, v: rule(
                index[id(e)], e, v, lookup, f"{inner}{index[id(e)]}"))
        return rule
    return simple_pass("inline", make_rule)
