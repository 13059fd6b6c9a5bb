"""The two ways a pass builds its new jaxpr, neither of which re-traces a whole jaxpr.

Structural passes (dce, cse, inline, fold_constants) *edit* equation lists (:func:`edit`,
``ir.edit``): JAX's equations are copied with their params, literals, effects and weak types, and
only what they read changes. Numeric rewrites (the conv rules, :func:`transform`) compute
replacement outputs with ordinary JAX code; only that code is traced (``compat.Fragment``), and
its equations are spliced in where the replaced ones were, so params, literals, effects and weak
types come out as JAX makes them there too. Either returns its input object when nothing fired.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable, Optional

from mlsys_jax.compat import (ClosedJaxpr, Fragment, Literal, Tracer, Var, bind_equation,
                              check_equation, eval_context)
from mlsys_jax.ir.edit import Const, Editor, known
from mlsys_jax.ir.keys import signature
from mlsys_jax.ir.primitives import ARRAY_OPS
from mlsys_jax.ir.walk import bodies, body_path


@dataclass(frozen=True)
class Rewrite:
    """One rule firing: which rule, where (an equation path as in ``ir.walk``), and what it did."""

    rule: str
    where: str
    detail: str = ""


@dataclass(frozen=True)
class Refusal:
    """A rule whose pattern matched but whose precondition failed: the reason, and the name of
    the check that failed (a rule's precondition, or ``translation_validation``)."""

    rule: str
    where: str
    reason: str
    check: str = ""


class Log:
    """Collects rewrites and refusals while a pass rewrites a jaxpr."""

    def __init__(self, name: str):
        self.name, self.rewrites, self.refusals = name, [], []

    def fired(self, where: str, detail: str = "", rule: str | None = None):
        self.rewrites.append(Rewrite(rule or self.name, where, detail))

    def refused(self, where: str, reason: str, rule: str | None = None, check: str = ""):
        self.refusals.append(Refusal(rule or self.name, where, reason, check))


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


# Numeric rewrites (passes/rules/): rule(index, eqn, invals, lookup, path) -> the equation's
# replacement outputs computed with ordinary JAX code (a list), or ``{var: value}`` for values of
# this or later equations (a rewrite spanning several; a later equation whose outputs are all
# given is dropped, the rest are kept for DCE), or None to keep the equation. ``lookup(var)``
# gives a value known now (a constant) or a tracer; ``invals`` are ``lookup`` of its inputs.
Rule = Callable[[int, object, list, Callable, str], Optional[object]]


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
    with eval_context():  # analysis evaluates constants eagerly, with the evaluator's kernels
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

    given: set = set()  # later equations' outputs already given by a rewrite
    for i, eqn in enumerate(ed.jaxpr.eqns):
        here = f"{path}{i}"
        if given and eqn.outvars and all(v in given for v in eqn.outvars):
            continue
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
        if isinstance(outs, dict):
            for v, x in outs.items():
                ed.bind([v], [x if isinstance(x, Tracer) else known(x, v)])
            given.update(outs)
            outs = None
            if all(v in given for v in eqn.outvars):
                continue
        if outs is not None:
            ed.bind(eqn.outvars, [x if isinstance(x, Tracer) else known(x, v)
                                  for x, v in zip(outs, eqn.outvars)])
            continue
        _keep(ed, eqn, here, rewrite if recurse else None, log)
    if len(log.rewrites) == before:
        if frag:
            frag[0].close()
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
