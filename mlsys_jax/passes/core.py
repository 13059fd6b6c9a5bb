"""Pass machinery: a pass is a named pure function ClosedJaxpr -> PassResult (docs/architecture.md "Passes").

How a pass builds its new jaxpr (editing equation lists, or tracing only a rule's replacement)
is ``passes.engine``; its names that rules use are re-exported here. A pass that finds nothing to
do returns its input object unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mlsys_jax.compat import ClosedJaxpr, Tracer
from mlsys_jax.ir import structural_hash
from mlsys_jax.ir.consts import is_pure  # noqa: F401  (re-exported: the passes' purity rule)
from mlsys_jax.passes.engine import Log, Refusal, Rewrite, edit
from mlsys_jax.passes.engine import transform  # noqa: F401  (re-exported for the conv rules)

__all__ = ["Rewrite", "Refusal", "PassResult", "Pass", "Runner", "make_pass", "chain",
           "FixpointError", "fixpoint", "is_concrete", "is_pure", "Log", "transform", "edit_pass"]


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

    A plain pass's ``fn`` takes the jaxpr (and may return just a jaxpr). A ``composite`` pass — a
    ``chain`` or ``fixpoint`` — has an ``fn`` taking the jaxpr and a :class:`Runner` that applies
    each plain pass inside it: calling a pass uses the bare ``Runner``, ``passes.run`` one that
    verifies after every pass and logs costs — so sequencing and fixpoint iteration exist once, in
    :func:`chain` and :func:`fixpoint`.
    """

    name: str
    fn: Callable = field(repr=False)
    composite: bool = False

    def __call__(self, closed: ClosedJaxpr) -> PassResult:
        return self.apply(closed, Runner())

    def apply(self, closed: ClosedJaxpr, runner: "Runner") -> PassResult:
        """Run this pass with ``runner`` applying every plain pass inside it."""
        if self.composite:
            return self.fn(closed, runner)
        return runner.step(self, closed)


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
    """Run passes in order (like optax.chain); ``run`` verifies after each one.

    >>> from mlsys_jax import passes
    >>> pipeline = passes.chain(passes.inline(), passes.cse(), passes.dce())
    >>> pipeline.name
    'chain(inline,cse,dce)'
    """
    def fn(closed, runner):
        rewrites, refusals, changed = [], [], False
        for p in passes:
            r = p.apply(closed, runner)
            closed, changed = r.jaxpr, changed or r.changed
            rewrites += r.rewrites
            refusals += r.refusals
        return PassResult(closed, changed, tuple(rewrites), tuple(refusals))
    return Pass("chain(" + ",".join(p.name for p in passes) + ")", fn, composite=True)


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
    return Pass(name, fn, composite=True)


def is_concrete(x) -> bool:
    """A value known while re-tracing (a constant or literal), not a tracer of the new jaxpr."""
    return not isinstance(x, Tracer)


def edit_pass(name: str, make_visit: Callable, cleanup: Callable | None = None) -> Pass:
    """A structural pass from a visitor factory (see ``engine.edit``), optionally cleaned up."""
    def fn(closed):
        log = Log(name)
        new = edit(closed, make_visit, log)
        if new is not closed and cleanup is not None:
            new = cleanup(new)
        return PassResult(new, new is not closed, tuple(log.rewrites), tuple(log.refusals))
    return Pass(name, fn)
