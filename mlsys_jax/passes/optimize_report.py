"""One call that optimizes a traced function and returns every figure a report of it shows.

Optimizing for a report is more than ``passes.run``: the pipeline (or the TASO-style search,
which starts from the pipeline's result), both graphs costed unfused and fused, the value check
on the example inputs and fresh ones (``value_check``), a verdict that puts a verifier failure
before the values, and, when asked, both graphs timed here. ``optimize_report`` does it in that
order and returns an ``OptimizeReport``; the ``optimize`` command only parses and formats.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlsys_jax.cost import estimate


@dataclass(frozen=True, kw_only=True)
class OptimizeReport:
    """The graphs before and after, what changed them and how sure the change is."""

    before: object                  # the traced ClosedJaxpr
    after: object                   # the optimized one (``before`` when the verifier failed)
    logged: object                  # passes.RunResult or search.SearchResult (None: failed)
    before_unfused: object          # cost.CostReport: one kernel per op
    before_fused: object            # cost.CostReport: the hardware's fusion model
    after_unfused: object
    after_fused: object
    rewrites: list                  # [{"rule", "where", "detail"}]
    refusals: list                  # [{"rule", "where", "reason", "check"}]
    searched: dict | None           # the search's path and figures (None: the pipeline)
    check: object                   # value_check.ValueCheck
    verdict: str                    # "yes" | "no" | "not established"
    failure: str                    # why not "yes" ("" when it is)
    measured: dict | None           # both graphs timed here, predictions beside (None: not asked)

    @property
    def verified(self) -> bool:
        return self.verdict == "yes"


def optimize_report(closed, inputs, *, pipeline=None, search: bool = False, alpha: float = 1.05,
                    search_budget: int = 100, search_measured: int = 0, hw, dtype,
                    rounds: int | None = None, observe=None, progress=None) -> OptimizeReport:
    """Optimize ``closed`` with ``pipeline`` (``search``: the cost-based search within
    ``search_budget`` graphs, timing ``search_measured`` of them), cost both graphs on ``hw``,
    check their values on ``inputs`` and, with ``rounds``, time both here. ``observe`` sees every
    graph a rewrite's path refers to (``passes.run``'s hook); ``progress`` names each stage."""
    from mlsys_jax import passes as P
    from mlsys_jax.progress import SILENT
    from mlsys_jax.passes.search import search as run_search
    from mlsys_jax.passes.value_check import check_values

    searched, progress = None, progress or SILENT
    progress.stage("searching rewrites, each validated on its region" if search else
                   "rewriting, each rewrite validated on its region")
    try:
        if search:
            found = run_search(closed, alpha=alpha, hw=hw, dtype=dtype, budget=search_budget,
                               measure=search_measured, observe=observe)
            after, logged = found.best, found
            searched = {"path": found.path_rows(), "explored": found.explored,
                        "budget": search_budget, "alpha": alpha, "seconds": found.seconds,
                        "measured": found.measured}
        else:
            logged = P.run(pipeline, closed, verify=True, hw=hw, dtype=dtype, observe=observe)
            after = logged.jaxpr
        rewrites = [{"rule": r.rule, "where": r.where, "detail": r.detail}
                    for r in logged.rewrites]
        refusals = [{"rule": r.rule, "where": r.where, "reason": r.reason, "check": r.check}
                    for r in logged.refusals]
        broken = ""
    except P.VerificationError as e:  # a pass bug, not a user error: reported, verdict "no"
        after, rewrites, refusals, broken = closed, [], [], str(e)
        logged = None
    # the fused estimate first: on a measured model (``here``) the default table's kernels are
    # measured before a time budget can run out
    progress.stage("costing both graphs")
    costs = []
    for graph in (closed, after):
        fused = estimate(graph, hw=hw, dtype=dtype, fused=True)
        costs += [estimate(graph, hw=hw, dtype=dtype, fused=False), fused]
    progress.stage("checking values: both graphs on the inputs and fresh ones")
    check = check_values(closed, after, inputs)
    verdict, failure = _verdict(broken, check, rewrites)
    measured = None
    if rounds is not None:
        progress.stage("timing both graphs under jax.jit")
        measured = _measure(closed, after, inputs, rounds, costs)
    return OptimizeReport(before=closed, after=after, logged=logged, before_unfused=costs[0],
                          before_fused=costs[1], after_unfused=costs[2], after_fused=costs[3],
                          rewrites=rewrites, refusals=refusals, searched=searched, check=check,
                          verdict=verdict, failure=failure, measured=measured)


def _verdict(broken: str, check, rewrites) -> tuple[str, str]:
    """('yes' | 'no' | 'not established', why): the verifier's failure first, then the values."""
    if broken:
        return "no", broken
    if check.verdict == "no":
        more = f" (and {len(check.problems) - 3} more)" if len(check.problems) > 3 else ""
        return "no", "; ".join(check.problems[:3]) + more
    if check.verdict == "not established":
        validated = (f"; each of the {len(rewrites)} rewrite(s) passed translation validation on "
                     "its region") if rewrites else ""
        return "not established", check.why_not_established() + validated
    return "yes", ""


def _measure(before, after, inputs, rounds: int, costs) -> dict:
    """Both graphs timed here side by side, with the hardware's default estimates beside."""
    from mlsys_jax.cost.measure import measure_speedup

    before_unfused, before_fused, after_unfused, after_fused = costs
    fused = before_unfused.hardware.fused_default
    return {**measure_speedup(before, after, inputs, repeats=rounds).to_dict(),
            "original_predicted_us": (before_fused if fused else before_unfused).time_us,
            "optimized_predicted_us": (after_fused if fused else after_unfused).time_us}
