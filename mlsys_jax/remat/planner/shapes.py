"""``remat`` on shapes: plans for a model that is never allocated, chosen by compiled temp bytes
and a predicted step time.

On shapes nothing runs, so no plan is timed and no gradient is checked against ``jax.grad``.
The budget and the frontier are what they are on arrays — XLA's temp bytes of each plan compiled
(``Frontier``: no remat, the least-peak plans, the plans that bracket the budget) — and of the
plans that fit, the one with the least *predicted* step time wins, predicted compute-bound: the
plan's FLOPs over no remat's, both as XLA compiled them with scan bodies counted per trip
(``cost.xla``; recomputation adds FLOPs, the memory it saves does not show in this ratio).
A model whose layers are a scan gets plans that checkpoint the scan's body
(``planner.scan_bodies``) beside the MILP's. The roofline estimate of our own cost model is not used here:
it does not yet cost a plan's recomputing segments (``custom_vjp`` around a ``cond``) as XLA
runs them, and predicted a recomputing GPT-2 at half no remat's time. JAX's built-in policies
are compiled beside them, not timed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from mlsys_jax.progress import SILENT, Progress
from mlsys_jax.remat.milp import Plan, plan_key
from mlsys_jax.remat.planner.budget import Budget, parse_budget
from mlsys_jax.remat.planner.frontier import Frontier

PREDICTION = "compute-bound: XLA's compiled FLOPs (scan bodies per trip) over no remat's"


@dataclass(frozen=True, kw_only=True)
class ShapesPlanReport:
    """The plan chosen on shapes, the plans it was chosen among, and JAX's policies compiled."""

    abstract = True          # planned on shapes: compiled, nothing run (not a field)
    budget: Budget
    budget_bytes: int
    plan: Plan
    no_remat: Plan
    predicted: dict          # label -> predicted step time over no remat's (the fitting plans)
    labels: dict             # plan_key -> label of every compiled plan
    compiled: tuple          # every compiled plan, in compile order
    policies: list           # {"policy", "compiled_temp_bytes", "compiled_flops"}

    @property
    def predicted_step_time_ratio(self) -> float:
        return self.predicted[self.labels[plan_key(self.plan)]]

    def to_dict(self) -> dict:
        """``remat --json`` on shapes: the keys of a run on arrays (their measured ones None)."""
        return {**json_figures(self.budget_bytes, self.plan, step_time_ratio=None,
                               grads_max_abs_diff=None, policies=self.policies, abstract=True),
                "predicted_step_time_ratio": self.predicted_step_time_ratio,
                "predicted_as": PREDICTION,
                "frontier": [{"label": self.labels[plan_key(q)],
                              "compiled_temp_bytes": q.compiled_temp_bytes,
                              "compiled_flops": q.compiled_flops,
                              "predicted_step_time_ratio": self.predicted.get(
                                  self.labels[plan_key(q)])} for q in self.compiled]}


def json_figures(budget_bytes: int, p: Plan, **measured) -> dict:
    """``JSON_KEYS`` of a plan at a budget; ``measured`` gives the figures a run measured (step
    time, gradients' |Δ|, policies) and ``abstract``, in that order."""
    return {"budget_bytes": budget_bytes, "predicted_peak_bytes": p.predicted_peak_bytes,
            "compiled_temp_bytes": p.compiled_temp_bytes, "compiled_flops": p.compiled_flops,
            "step_time_ratio": measured["step_time_ratio"],
            "grads_max_abs_diff": measured["grads_max_abs_diff"],
            "saved": list(p.saved), "recomputed": list(p.recomputed),
            "policies": measured["policies"], "abstract": measured["abstract"]}


def plan_on_shapes(loss_fn, params, batch, budget, *, policies: bool = True,
                   progress: Progress = SILENT) -> ShapesPlanReport:
    """Plan ``jax.grad(loss_fn)`` at ``budget`` (compiled temp bytes, as on arrays) for
    ``ShapeDtypeStruct`` parameters and batch; the fitting plan of least predicted time wins."""
    from mlsys_jax.remat.planner.policies import policy_programs

    wanted = parse_budget(budget)                      # a bad budget fails before any work
    fr = Frontier(loss_fn, params, batch, repeats=1, progress=progress, flops_per_trip=True)
    nbytes = wanted.bytes_of(fr.no_remat.compiled_temp_bytes)
    if nbytes is None:              # min: the least-peak plans, compiled; the least of them fits
        fr.compile_least()
        nbytes = fr.min_budget_bytes
        fitting = fr.fitting(nbytes)
    else:
        fitting = fr.search(nbytes)     # the plans compiled that fit (no remat, if it does)
    if not fitting:
        raise fr.refusal(nbytes)
    base = fr.no_remat.compiled_flops
    predicted = {fr.labels[plan_key(p)]: p.compiled_flops / base for p in fitting}
    chosen = min(fitting, key=lambda p: (predicted[fr.labels[plan_key(p)]],
                                         p.compiled_temp_bytes))
    built = policy_programs(fr) if policies else {}
    return ShapesPlanReport(
        budget=wanted, budget_bytes=nbytes, plan=replace(chosen, budget_bytes=nbytes),
        no_remat=fr.no_remat, predicted=predicted, labels=dict(fr.labels),
        compiled=tuple(fr.measured),
        policies=[{"policy": name, "compiled_temp_bytes": prog.temp_bytes,
                   "compiled_flops": prog.flops} for name, prog in built.items()])
