"""Pass machinery: a pass is a named pure function ClosedJaxpr -> PassResult (DESIGN.md §3).

Two engines build the new jaxpr. Structural passes (dce, cse, inline, fold_constants) *edit*
equation lists (:func:`edit`, ``ir.edit``): JAX's equations are copied with their params,
literals, effects and weak types, and only what they read changes — no re-tracing. Numeric
rewrites (the conv rules) *re-trace* (:func:`transform`): the foundation's interpreter runs under
``jax.make_jaxpr`` and a rule computes replacement outputs with ordinary JAX code. A pass that finds
nothing to do returns its input object unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import jax

from mlsys_jax.compat import ClosedJaxpr, Literal, Tracer, bind_equation, check_equation
from mlsys_jax.ir import eval_jaxpr, input_structs, structural_hash
from mlsys_jax.ir.edit import Editor
from mlsys_jax.ir.keys import signature
from mlsys_jax.ir.primitives import ARRAY_OPS, NAMED_CALLS, PURE
from mlsys_jax.ir.walk import bodies, body_path


@dataclass(frozen=True)
class Rewrite:
    """One rule firing: which rule, where (an equation path as in ``ir.walk``), and what it did."""

    rule: str
    where: str
    detail: str = ""


@dataclass(frozen=True)
class Refusal:
    """A rule whose pattern matched but whose precondition failed, with the reason."""

    rule: str
    where: str
    reason: str


@dataclass(frozen=True)
class PassResult:
    """What a pass returns: the new jaxpr, whether it changed, rewrites applied and refusals."""

    jaxpr: ClosedJaxpr
    changed: bool
    rewrites: tuple = ()
    refusals: tuple = ()


@dataclass(frozen=True)
class Pass:
    """A named pure function ClosedJaxpr -> PassResult (wrap ``fn`` to instrument or break it).

    A plain pass's ``fn`` takes the jaxpr (and may return just a jaxpr). A ``chain``'s or
    ``fixpoint``'s ``fn`` takes the jaxpr and a :class:`Runner` that applies each plain pass:
    calling a pass uses the bare ``Runner``, ``passes.run`` one that verifies after every pass and
    logs costs — so sequencing and fixpoint iteration exist once, in :func:`chain` and
    :func:`fixpoint`.
    """

    name: str
    fn: Callable = field(repr=False)
    parts: tuple = ()        # chain: the passes in order; fixpoint: the repeated pass
    kind: str = "pass"       # "pass" | "chain" | "fixpoint"
    max_iter: int = 25

    def __call__(self, closed: ClosedJaxpr) -> PassResult:
        return self.apply(closed, Runner())

    def apply(self, closed: ClosedJaxpr, runner: "Runner") -> PassResult:
        """Run this pass with ``runner`` applying every plain pass inside it."""
        if self.kind == "pass":
            return runner.step(self, closed)
        return self.fn(closed, runner)


class Runner:
    """Applies one plain pass and hashes graphs for :func:`fixpoint`'s cycle check. This one just
    calls the pass; ``passes.run`` subclasses it to verify and log every step."""

    def step(self, p: Pass, closed: ClosedJaxpr) -> PassResult:
        out = p.fn(closed)
        if isinstance(out, ClosedJaxpr):  # a bare function may return just the jaxpr
            return PassResult(out, out is not closed)
        return out

    def hash(self, closed: ClosedJaxpr) -> str:
        return structural_hash(closed)


def make_pass(name: str, fn: Callable) -> Pass:
    return Pass(name, fn)


def chain(*passes: Pass) -> Pass:
    """Run passes in order (like optax.chain); ``run`` verifies after each one."""
    def fn(closed, runner):
        rewrites, refusals, changed = [], [], False
        for p in passes:
            r = p.apply(closed, runner)
            closed, changed = r.jaxpr, changed or r.changed
            rewrites += r.rewrites
            refusals += r.refusals
        return PassResult(closed, changed, tuple(rewrites), tuple(refusals))
    return Pass("chain(" + ",".join(p.name for p in passes) + ")", fn, tuple(passes), "chain")


class FixpointError(RuntimeError):
    """A fixpoint loop did not converge within its bound, or revisited an earlier graph."""


def fixpoint(p: Pass, max_iter: int = 25) -> Pass:
    """Repeat ``p`` until it changes nothing; at most ``max_iter`` rounds (XLA uses 25), and a
    revisited graph (a rewrite cycle) is an error."""
    name = f"fixpoint({p.name})"

    def fn(closed, runner):
        seen = {runner.hash(closed)}
        rewrites, refusals, changed = [], [], False
        for _ in range(max_iter):
            r = p.apply(closed, runner)
            if not r.changed:
                return PassResult(closed, changed, tuple(rewrites), tuple(refusals) + r.refusals)
            closed, changed = r.jaxpr, True
            rewrites += r.rewrites
            refusals += r.refusals
            h = runner.hash(closed)
            if h in seen:
                raise FixpointError(f"{name}: rewrite cycle — a graph came back")
            seen.add(h)
        raise FixpointError(f"{name}: no fixpoint within {max_iter} rounds")
    return Pass(name, fn, (p,), "fixpoint", max_iter)


def is_concrete(x) -> bool:
    """A value known while re-tracing (a constant or literal), not a tracer of the new jaxpr."""
    return not isinstance(x, Tracer)


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


# ---- the engines -----------------------------------------------------------------------------

class Log:
    """Collects rewrites and refusals while a pass rewrites a jaxpr."""

    def __init__(self, name: str):
        self.name, self.rewrites, self.refusals = name, [], []

    def fired(self, where: str, detail: str = "", rule: str | None = None):
        self.rewrites.append(Rewrite(rule or self.name, where, detail))

    def refused(self, where: str, reason: str, rule: str | None = None):
        self.refusals.append(Refusal(rule or self.name, where, reason))


def edited_params(eqn, here: str, rewrite: Callable, log: Log) -> dict | None:
    """``eqn``'s params with every nested body replaced by ``rewrite(body, path)`` where that
    changed it and kept its signature (so jit tuples and scan/while/cond counts stay valid); None
    when no body changed."""
    subs = bodies(eqn)
    if not subs:
        return None
    params, changed = dict(eqn.params), False
    for b in subs:
        old = eqn.params[b.param] if b.index is None else eqn.params[b.param][b.index]
        old_closed = old if b.is_closed else ClosedJaxpr(old, ())
        new = rewrite(old_closed, body_path(here, b))
        if new is old_closed:
            continue
        if signature(old_closed) != signature(new) or (not b.is_closed and new.consts):
            log.refused(f"{here}/{b.label}", "rewritten body would change its signature or need "
                        "constants an open jaxpr cannot hold; body left as it was")
            continue
        new_val = new if b.is_closed else new.jaxpr
        if b.index is None:
            params[b.param] = new_val
        else:
            params[b.param] = tuple(new_val if k == b.index else v
                                    for k, v in enumerate(params[b.param]))
        changed = True
    return params if changed else None


def _rejected(eqn, here: str, log: Log, err: Exception) -> None:
    log.refused(here, f"{eqn.primitive.name} rejected the rewritten body ({type(err).__name__}); "
                "equation left as it was")


# Structural passes edit equation lists (``ir.edit``): visit(i, eqn) -> True when it dropped or
# replaced equation ``i`` (path ``f"{path}{i}"``) through the editor; an equation it leaves is
# kept, its bodies edited the same way.
Visit = Callable[[int, object], bool]


def edit(closed: ClosedJaxpr, make_visit: Callable, log: Log, path: str = "") -> ClosedJaxpr:
    """Edit ``closed`` with ``make_visit(editor, log, path)``'s visitor, level by level: JAX's
    equations are copied, not re-traced (``ir.edit``). Returns ``closed`` itself when nothing
    changed anywhere."""
    ed = Editor(closed)
    visit = make_visit(ed, log, path)

    def rewrite(body, body_path):
        return edit(body, make_visit, log, body_path)

    for i, eqn in enumerate(ed.jaxpr.eqns):
        if visit(i, eqn):
            continue
        here = f"{path}{i}" if eqn.primitive.name not in ARRAY_OPS else ""
        params = edited_params(eqn, here, rewrite, log) if here else None
        if params is not None:
            try:  # what binding the new body would check (cond branches agree, scan carries, ...)
                check_equation(eqn.replace(params=params))
            except Exception as e:
                _rejected(eqn, here, log, e)
                params = None
        ed.keep(eqn, params)
    return ed.finish()


def edit_pass(name: str, make_visit: Callable, cleanup: Callable | None = None) -> Pass:
    """A structural pass from a visitor factory (see :func:`edit`), optionally cleaned up (DCE)."""
    def fn(closed):
        log = Log(name)
        new = edit(closed, make_visit, log)
        if new is not closed and cleanup is not None:
            new = cleanup(new)
        return PassResult(new, new is not closed, tuple(log.rewrites), tuple(log.refusals))
    return Pass(name, fn)


# Numeric rewrites (passes/conv.py) re-trace: rule(index, eqn, invals, lookup, path) -> replacement
# outputs computed with ordinary JAX code (list), or None to keep the equation.
Rule = Callable[[int, object, list, Callable, str], Optional[list]]


def transform(closed: ClosedJaxpr, make_rule: Callable, log: Log, path: str = "",
              recurse: bool = True) -> ClosedJaxpr:
    """Re-trace ``closed`` applying ``make_rule(closed, log, path)``'s rule to each equation and,
    where the rule keeps an equation with nested bodies, ``transform`` to those bodies.

    Returns ``closed`` itself when nothing fired anywhere.
    """
    with jax.ensure_compile_time_eval():  # analysis evaluates constants eagerly, even nested
        rule = make_rule(closed, log, path)
    before = len(log.rewrites)
    jaxpr = closed.jaxpr
    index = {id(e): i for i, e in enumerate(jaxpr.eqns)}

    def body(*args):
        env = dict(zip(jaxpr.constvars, closed.consts))
        env.update(zip(jaxpr.invars, args))

        def lookup(v):
            return v.val if isinstance(v, Literal) else env[v]

        def handler(eqn, invals):
            i = index[id(eqn)]
            env.update((v, x) for v, x in zip(eqn.invars, invals) if not isinstance(v, Literal))
            here = f"{path}{i}"
            outs = rule(i, eqn, invals, lookup, here) if rule is not None else None
            if outs is None and recurse:
                outs = _rebind_bodies(eqn, invals, make_rule, log, here)
            if outs is None:
                outs = bind_equation(eqn, invals)
            env.update(zip(eqn.outvars, outs))
            return outs

        return eval_jaxpr(jaxpr, closed.consts, *args, handler=handler)

    new = jax.make_jaxpr(body)(*input_structs(closed))
    return new if len(log.rewrites) > before else closed


def _rebind_bodies(eqn, invals, make_rule, log, here) -> list | None:
    """``transform`` every nested body; rebind with the new bodies, else keep the equation."""
    params = edited_params(eqn, here, lambda b, p: transform(b, make_rule, log, p), log)
    if params is None:
        return None
    try:
        return bind_equation(eqn.replace(params=params), invals)
    except Exception as e:  # a primitive that rejects the rebuilt body: leave it untouched
        _rejected(eqn, here, log, e)
        return None
