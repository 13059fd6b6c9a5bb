"""``run(pipeline, closed, verify=True)``: apply passes, verify after each, log rewrites and cost."""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass

from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir import structural_hash
from mlsys_jax.passes.core import Pass, PassResult, Runner
from mlsys_jax.passes.validate import validating
from mlsys_jax.passes.verify import (Checker, VerificationError, fingerprint,
                                     require_static_shapes, unchanged_since,
                                     verify as verify_step)


@dataclass(frozen=True)
class LogEntry:
    """One pass application: what fired, what was refused, cost before and after, seconds."""

    pass_name: str
    changed: bool
    rewrites: tuple
    refusals: tuple
    cost_before: dict | None
    cost_after: dict | None
    seconds: float


@dataclass(frozen=True)
class RunResult:
    """The optimized jaxpr and the log of every pass applied (in order)."""

    jaxpr: ClosedJaxpr
    log: tuple

    @property
    def rewrites(self) -> list:
        return [r for e in self.log for r in e.rewrites]

    @property
    def refusals(self) -> list:
        return [r for e in self.log for r in e.refusals]

    @property
    def changed(self) -> bool:
        return any(e.changed for e in self.log)


def cost_summary(closed, hw="h100", dtype=None) -> dict:
    """Kernels, FLOPs and roofline µs of a jaxpr under the cost model."""
    from mlsys_jax.cost import estimate

    r = estimate(closed, hw=hw, dtype=dtype)
    return {"kernels": len(r.kernels), "flops": r.total_flops, "time_us": r.time_us}


def run(pipeline: Pass, closed: ClosedJaxpr, verify: bool = True, hw="h100", dtype=None,
        cost: bool = True, validate: bool = True, observe=None) -> RunResult:
    """Apply ``pipeline`` (a pass, ``chain`` or ``fixpoint``) to ``closed``.

    With ``verify``, every pass that ran is checked (docs/verification.md §1): input not mutated,
    honest about changing, and — if it changed something — well-typed, same signature (weak_type
    too), same effects, nested params consistent, static shapes. A failure raises
    VerificationError naming the pass. With ``validate``, every rewrite a rule makes is first
    checked on its region (translation validation, ``passes/validate.py``) and refused, with the
    measured reason, where it changes a value. Returns the new jaxpr and the log.
    ``observe(pass_name, input, result)``, if given, sees each pass's input jaxpr beside its
    result (the paths of its rewrites and refusals are paths of that input).

    >>> from mlsys_jax import ir, passes
    >>> closed = ir.trace(lambda x: (x * 2.0 + x * 2.0).sum(), "f32[8,8]")
    >>> [e.primitive.name for e in closed.jaxpr.eqns]
    ['mul', 'mul', 'add', 'reduce_sum']
    >>> result = passes.run(passes.chain(passes.cse(), passes.dce()), closed)
    >>> result.changed, [e.primitive.name for e in result.jaxpr.jaxpr.eqns]
    (True, ['mul', 'add', 'reduce_sum'])
    """
    if not isinstance(closed, ClosedJaxpr):
        raise MlsysError(f"passes.run: expected a ClosedJaxpr (from ir.trace), got "
                         f"{type(closed).__name__}; trace your function first")
    if not isinstance(pipeline, Pass):
        raise MlsysError(f"passes.run: expected a Pass (e.g. passes.chain(passes.dce())), got "
                         f"{type(pipeline).__name__}")
    require_static_shapes(closed, "passes.run")
    runner = _VerifyingRunner(verify, (hw, dtype) if cost else None, observe)
    with collector_paused(), validating(validate):
        out = pipeline.apply(closed, runner)
    return RunResult(out.jaxpr, tuple(runner.log))


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a run builds its graphs, then one collection of
    the young generation. What a run allocates (equations, folded constants, the verifier's
    tables, the log) lives until the run ends, so every generation-1 collection during it would
    walk all of it again: on a 10,000-equation program that is ~10% of the run, and it grows faster
    than the program (``benchmarks/bench_passes.py``'s scaling figure). Reference counting still
    frees everything else at once; only reference cycles wait, and the collection at the end
    takes them. Nested runs (or a collector already off) leave it as they found it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.collect(0)


class _VerifyingRunner(Runner):
    """Applies each plain pass of a pipeline (``chain``/``fixpoint`` sequence them), verifying
    it and logging its rewrites and costs. One :class:`~mlsys_jax.passes.verify.Checker` per run
    remembers what is verified, so each graph level is checked once; a graph is hashed (for
    ``fixpoint``) once per run. References are held, so ids stay unique."""

    def __init__(self, verify: bool, costing, observe=None):
        self.verify, self.costing, self.log, self.hashes = verify, costing, [], {}
        self.observe = observe
        self.checker = Checker()
        self.prints: dict = {}  # id(graph) -> (graph, its fingerprint when last seen untouched)

    def hash(self, closed) -> str:
        hit = self.hashes.get(id(closed))
        if hit is None:
            hit = self.hashes[id(closed)] = (closed, structural_hash(closed))
        return hit[1]

    def step(self, p: Pass, closed) -> PassResult:
        before = self._fingerprint(closed) if self.verify else None
        cost_before = cost_summary(closed, *self.costing) if self.costing else None
        t0 = time.perf_counter()
        result = super().step(p, closed)
        seconds = time.perf_counter() - t0
        if self.verify:
            self._verify(p.name, closed, result, before)
        cost_after = (cost_summary(result.jaxpr, *self.costing) if self.costing and result.changed
                      else cost_before)
        self.log.append(LogEntry(p.name, result.changed, result.rewrites, result.refusals,
                                 cost_before, cost_after, seconds))
        if self.observe is not None:
            self.observe(p.name, closed, result)
        return result

    def _fingerprint(self, closed) -> list:
        hit = self.prints.get(id(closed))  # the previous pass returned its input: taken already
        return hit[1] if hit is not None else fingerprint(closed)

    def _verify(self, name: str, closed, result: PassResult, before: list) -> None:
        if not unchanged_since(closed, before):
            raise VerificationError(f"verifier: pass {name!r}: mutated its input jaxpr")
        self.prints = {id(closed): (closed, before)}
        if (not result.changed and result.jaxpr is not closed
                and self.hash(result.jaxpr) != self.hash(closed)):
            raise VerificationError(f"verifier: pass {name!r}: reported 'unchanged' but the "
                                    "jaxpr differs")
        verify_step(name, closed, result.jaxpr, result.changed, self.checker)
