"""How a conv rule becomes a pass: plan where it fires (or why it refuses), then re-trace.

A rule's *plan function* analyses one jaxpr level and returns ``{eqn index: Plan}``; the pass
re-traces with a handler that emits each plan's outputs with ordinary JAX code; orphaned equations
are removed by DCE. ``only=k`` applies just the k-th top-level rewrite (the search's moves, §4.4).
"""
from __future__ import annotations

import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.ir.walk import bodies, body_path, equations
from mlsys_jax.passes.basic import dce_jaxpr
from mlsys_jax.passes.convsites import CONV, Consts
from mlsys_jax.passes.core import Log, Pass, PassResult, is_concrete, transform


class Plan:
    """Outputs for one equation; ``first`` groups the equations of one rewrite (for ``only``)."""

    def __init__(self, first: int, detail: str, emit):
        self.first, self.detail, self.emit = first, detail, emit


def conv_pass(name: str, plan_fn, only=None, **options) -> Pass:
    """A pass from ``plan_fn(jaxpr, consts, log, path, **options) -> {eqn index: Plan}``."""
    def make_rule(closed, log, path):
        top = path == ""
        if only is not None and not top:
            return None
        plans = plan_fn(closed.jaxpr, closed.consts, log, path, **options)
        if only is not None:
            firsts = sorted({p.first for p in plans.values()})
            keep = firsts[only] if only < len(firsts) else None
            plans = {i: p for i, p in plans.items() if p.first == keep}
        state: dict = {}

        def rule(i, eqn, invals, lookup, here):
            plan = plans.get(i)
            if plan is None:
                return None
            outs = plan.emit(lookup, state)
            if plan.first == i:
                log.fired(here, plan.detail)
            return outs
        return rule

    def fn(closed):
        log = Log(name)
        if not any(e.primitive.name == CONV for e in equations(closed)):
            return PassResult(closed, False)  # nothing to match: skip the re-trace
        new = transform(closed, make_rule, log, recurse=only is None)
        if new is not closed:
            new = dce_jaxpr(new)
        return PassResult(new, new is not closed, tuple(log.rewrites), tuple(log.refusals))
    return Pass(name if only is None else f"{name}@{only}", fn)


def value_of(lookup, consts: Consts, v):
    """A var's known constant value, else its value in the re-trace (a tracer)."""
    val = consts.value(v) if not isinstance(v, Literal) else v.val
    return val if val is not None else lookup(v)


def as_numpy(x):
    """A known value as NumPy (None stays None); traced values are returned as they are."""
    return x if x is None or not is_concrete(x) else np.asarray(x)


def levels(jaxpr, consts=(), path: str = ""):
    """``(jaxpr, consts, path prefix)`` of an open jaxpr and of every body nested in it (paths as
    ``ir.walk`` names them), for analyses that do not re-trace."""
    yield jaxpr, tuple(consts), path
    for i, e in enumerate(jaxpr.eqns):
        for b in bodies(e):
            yield from levels(b.jaxpr, b.consts, body_path(f"{path}{i}", b))
