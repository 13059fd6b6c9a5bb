"""``run(pipeline, closed, verify=True)``: apply passes, verify after each, log rewrites and cost."""
from __future__ import annotations

import time
from dataclasses import dataclass

from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir import structural_hash
from mlsys_jax.passes.core import FixpointError, Pass, PassResult
from mlsys_jax.passes.verify import require_static_shapes, verify as verify_step


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
        cost: bool = True) -> RunResult:
    """Apply ``pipeline`` (a pass, ``chain`` or ``fixpoint``) to ``closed``.

    With ``verify``, every pass that ran is checked (TESTING.md §1): input not mutated, honest
    about changing, and — if it changed something — well-typed, same signature (weak_type too),
    same effects, nested params consistent, static shapes. A failure raises VerificationError
    naming the pass. Returns the new jaxpr and the log.
    """
    if not isinstance(closed, ClosedJaxpr):
        raise MlsysError(f"passes.run: expected a ClosedJaxpr (from ir.trace), got "
                         f"{type(closed).__name__}; trace your function first")
    if not isinstance(pipeline, Pass):
        raise MlsysError(f"passes.run: expected a Pass (e.g. passes.chain(passes.dce())), got "
                         f"{type(pipeline).__name__}")
    require_static_shapes(closed, "passes.run")
    log: list = []
    out = _run(pipeline, closed, verify, log, (hw, dtype) if cost else None, _Hashes())
    return RunResult(out, tuple(log))


class _Hashes:
    """Structural hashes of the graphs of one run (a graph is hashed once; references are held
    so ids stay unique)."""

    def __init__(self):
        self.table: dict = {}

    def __call__(self, closed) -> str:
        hit = self.table.get(id(closed))
        if hit is None:
            hit = self.table[id(closed)] = (closed, structural_hash(closed))
        return hit[1]


def _run(p: Pass, closed, verify, log, costing, hashes):
    if p.kind == "chain":
        for part in p.parts:
            closed = _run(part, closed, verify, log, costing, hashes)
        return closed
    if p.kind == "fixpoint":
        seen = {hashes(closed)}
        for _ in range(p.max_iter):
            n = len(log)
            closed = _run(p.parts[0], closed, verify, log, costing, hashes)
            if not any(e.changed for e in log[n:]):
                return closed
            h = hashes(closed)
            if h in seen:
                raise FixpointError(f"{p.name}: rewrite cycle — a graph came back")
            seen.add(h)
        raise FixpointError(f"{p.name}: no fixpoint within {p.max_iter} rounds")
    before_hash = hashes(closed) if verify else None
    cost_before = cost_summary(closed, *costing) if costing else None
    t0 = time.perf_counter()
    result: PassResult = p(closed)
    seconds = time.perf_counter() - t0
    if verify:
        input_now = structural_hash(closed)  # was the input mutated?
        after_hash = input_now if result.jaxpr is closed else hashes(result.jaxpr)
        verify_step(p.name, closed, result.jaxpr, result.changed, before_hash, after_hash,
                    input_now)
    cost_after = (cost_summary(result.jaxpr, *costing) if costing and result.changed
                  else cost_before)
    log.append(LogEntry(p.name, result.changed, result.rewrites, result.refusals, cost_before,
                        cost_after, seconds))
    return result.jaxpr
