"""Plans chosen on the compiled program: a budget is XLA's temp bytes (lecture §7.2).

The MILP predicts the bytes the backward holds; XLA then fuses, reuses buffers and adds its own
working set, so compiled temp bytes differ from the prediction (no remat compiles to fewer temp
bytes than its predicted residuals, since XLA fuses masks and cheap elementwise work into the
backward; a plan that recomputes a few values can compile to *more* than no remat, because a
custom_vjp boundary stops that fusion; docs/remat.md has the figures). So ``plan``
solves the MILP on a ladder of predicted budgets, compiles each plan's gradient, and keeps the
Pareto frontier of (compiled temp bytes, compiled FLOPs), no remat included. For a budget it
returns the frontier point with the fewest FLOPs whose compiled temp fits — on a frontier also
the one with the most temp bytes, so a tighter budget never gives more compiled temp bytes.
"""
from __future__ import annotations

from dataclasses import replace

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.milp import Plan, plan_key
from mlsys_jax.remat.planner.apply import flat_applied
from mlsys_jax.remat.planner.budget import parse_budget
from mlsys_jax.remat.planner.flat import flatten_loss
from mlsys_jax.remat.planner.graph import loss_graph
from mlsys_jax.remat.planner.measure import compile_grad
from mlsys_jax.remat.planner.segments import SegmentedProblem

# predicted budgets tried: min + f·(store-all − min); above ~0.75 plans compile to more than no
# remat on the examples (the boundary costs more than the few values it frees)
LADDER = (0.0, 0.05, 0.1, 0.2, 0.3, 0.45, 0.65)
# where plans are also compiled with the whole segment backward pinned (planner.apply): on the
# flax transformer that reaches the least temp bytes, while pinning only the recomputation runs
# faster everywhere and compiles to fewer temp bytes near no remat
PIN_BACKWARD_UP_TO = 0.1


def pareto(plans: list[Plan]) -> list[Plan]:
    """Plans no other plan beats on both compiled temp bytes and compiled FLOPs (temp ascending)."""
    out = []
    for p in sorted(plans, key=lambda p: (p.compiled_temp_bytes, p.compiled_flops)):
        if not out or p.compiled_flops < out[-1].compiled_flops:
            out.append(p)
    return out


class Frontier:
    """Every ladder plan of one loss, compiled; ``plan(budget)`` picks on the measured frontier."""

    def __init__(self, loss_fn, params, batch, ladder=LADDER, time_limit_s: float = 20.0):
        self.flat = flatten_loss(loss_fn, params, batch, "plan")
        self.graph = loss_graph(self.flat)
        self.problem = SegmentedProblem(self.graph, time_limit_s)
        self.compiled = {}                      # plan_key -> compiled gradient
        base, temp, flops = compile_grad(self.flat.fn, self.flat)
        self.no_remat = replace(self.problem.solve(self.problem.store_all_bytes),
                                compiled_temp_bytes=temp, compiled_flops=flops)
        self.compiled[plan_key(self.no_remat)] = base
        self.measured = [self.no_remat]
        lo, hi = self.problem.min_budget_bytes, self.problem.store_all_bytes
        seen = set()
        for f in ladder:
            solved = self.problem.solve(int(lo + f * (hi - lo)))
            pins = ("recomputation", "backward") if f <= PIN_BACKWARD_UP_TO else \
                ("recomputation",)
            for p in (replace(solved, pin=pin) for pin in pins):
                if not p.recomputed or plan_key(p) in seen:
                    continue
                seen.add(plan_key(p))
                exe, temp, flops = compile_grad(flat_applied(self.graph, p), self.flat)
                p = replace(p, compiled_temp_bytes=temp, compiled_flops=flops)
                self.compiled[plan_key(p)] = exe
                self.measured.append(p)
        self.points = pareto(self.measured)

    @property
    def min_budget_bytes(self) -> int:
        """The least compiled temp bytes of any plan measured."""
        return self.points[0].compiled_temp_bytes

    def budget_bytes(self, budget) -> int:
        """``BYTES`` or ``'PCT%'`` (of no remat's compiled temp bytes) as bytes."""
        value, percent = parse_budget(budget)
        return int(self.no_remat.compiled_temp_bytes * value / 100) if percent else int(value)

    def plan(self, budget) -> Plan:
        """The measured plan with the fewest compiled FLOPs whose compiled temp fits ``budget``."""
        budget = self.budget_bytes(budget)
        least = self.min_budget_bytes
        if budget < least:
            raise MlsysError(f"budget {budget} bytes is below the minimum {least} bytes (the "
                             f"least compiled temp bytes of any plan, "
                             f"{least / self.no_remat.compiled_temp_bytes:.0%} of no remat's "
                             f"{self.no_remat.compiled_temp_bytes}); raise it to at least {least}")
        best = [p for p in self.points if p.compiled_temp_bytes <= budget][-1]
        return replace(best, budget_bytes=budget, min_budget_bytes=least)


def plan(loss_fn, params, batch, budget_bytes) -> Plan:
    """What to save and recompute for ``jax.grad(loss_fn)`` (parameters only) so that XLA's
    temp bytes fit ``budget_bytes`` (an int, or ``'60%'`` of no remat's), with the fewest FLOPs.

    Example::

        p = plan(loss_fn, params, batch, "60%")
        grads = jax.jit(jax.grad(apply(loss_fn, p, params, batch)))(params, batch)
    """
    return Frontier(loss_fn, params, batch).plan(budget_bytes)
