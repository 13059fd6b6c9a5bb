"""Pass machinery: a pass is a named pure function ClosedJaxpr -> PassResult (DESIGN.md §3).

No pass re-traces a whole jaxpr. Structural passes (dce, cse, inline, fold_constants) *edit*
equation lists (:func:`edit`, ``ir.edit``): JAX's equations are copied with their params,
literals, effects and weak types, and only what they read changes. Numeric rewrites (the conv
rules, :func:`transform`) compute replacement outputs with ordinary JAX code; only that code is
traced, and its equations are spliced in where the replaced ones were, so params, literals,
effects and weak types come out canonical there too. A pass that finds nothing to do returns its
input object unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

import jax

from mlsys_jax.compat import (ClosedJaxpr, Fragment, Literal, Tracer, Var, bind_equation,
                              check_equation)
from mlsys_jax.ir import structural_hash
from mlsys_jax.ir.edit import Const, Editor, known
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
        if eqn.primitive.name in ARRAY_OPS:
            ed.keep(eqn)
        else:
            _keep(ed, eqn, f"{path}{i}", rewrite, log)
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


# Numeric rewrites (passes/conv.py): rule(index, eqn, invals, lookup, path) -> replacement outputs
# computed with ordinary JAX code (list), or None to keep the equation. ``lookup(var)`` gives a
# value known now (a constant) or a tracer; ``invals`` are ``lookup`` of the equation's inputs.
Rule = Callable[[int, object, list, Callable, str], Optional[list]]


class _Inputs(Sequence):
    """An equation's inputs for a rule, looked up only when the rule reads them."""

    def __init__(self, invars, lookup):
        self.invars, self.lookup = invars, lookup

    def __len__(self):
        return len(self.invars)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self.lookup(v) for v in self.invars[k]]
        return self.lookup(self.invars[k])


def transform(closed: ClosedJaxpr, make_rule: Callable, log: Log, path: str = "",
              recurse: bool = True) -> ClosedJaxpr:
    """Apply ``make_rule(closed, log, path)``'s rule to each equation of ``closed`` and, where the
    rule keeps an equation with nested bodies, ``transform`` to those bodies.

    Only what a rule computes is traced (``compat.Fragment``, one per level): the equations it
    keeps are copied as JAX built them (``ir.edit``), and the replacements are spliced in where
    the replaced equations were. An equation reading a replacement of another type is bound
    again, so JAX types what follows. Returns ``closed`` itself when nothing fired anywhere.
    """
    with jax.ensure_compile_time_eval():  # analysis evaluates constants eagerly, even nested
        rule = make_rule(closed, log, path)
    before = len(log.rewrites)
    ed = Editor(closed)
    frag, args, arg_of = [], [], {}  # the level's fragment (made when first needed), its inputs

    def fragment():
        if not frag:
            frag.append(Fragment(f"transform {path}"))
        return frag[0]

    def lookup(v):
        x = ed.read(v)
        if type(x) is Literal:
            return x.val
        if type(x) is Const:
            return x.value
        if type(x) is not Var:
            return x  # already a tracer: a replacement computed earlier
        tracer = arg_of.get(x)
        if tracer is None:
            tracer = arg_of[x] = fragment().arg(x.aval)
            args.append(x)
        return tracer

    def rewrite(body, body_path):
        return transform(body, make_rule, log, body_path)

    for i, eqn in enumerate(ed.jaxpr.eqns):
        here = f"{path}{i}"
        retyped = ed.retyped and any(type(v) is not Literal and v in ed.retyped
                                     for v in eqn.invars)
        outs = None
        if rule is not None or retyped:
            f = fragment()
            start = f.mark()
            with f.active():
                if rule is not None:
                    outs = rule(i, eqn, _Inputs(eqn.invars, lookup), lookup, here)
                if outs is None and retyped:
                    outs = bind_equation(eqn, [lookup(v) for v in eqn.invars])
            if f.mark() > start:
                ed.splice(start, f.mark())
        if outs is not None:
            ed.bind(eqn.outvars, [x if isinstance(x, Tracer) else known(x, v)
                                  for x, v in zip(outs, eqn.outvars)])
            continue
        _keep(ed, eqn, here, rewrite if recurse else None, log)
    if len(log.rewrites) == before:
        return closed
    return ed.finish(frag[0] if frag else None, args)


def _keep(ed: Editor, eqn, here: str, rewrite: Callable | None, log: Log) -> None:
    """Keep ``eqn``, with its bodies rewritten by ``rewrite`` where that changed them and JAX's
    type check accepts the result (what binding it would check: cond branches agree, ...)."""
    params = edited_params(eqn, here, rewrite, log) if rewrite is not None else None
    if params is not None:
        try:
            check_equation(eqn.replace(params=params))
        except Exception as e:  # a primitive that rejects the rebuilt body: leave it untouched
            _rejected(eqn, here, log, e)
            params = None
    ed.keep(eqn, params)
