"""Recomputation plans for a user's loss, as the MILP (``remat.milp``) over segments (§7.2).

A plan cuts the loss's equations (in order) into segments. Every residual the backward reads —
an equation's input or output, or the intermediates of its JVP — is either *saved* (held from
the forward until its segment's backward) or *recomputed* (its equation re-run in the segment's
backward, from saved values and the segment's inputs). Segments with recomputation run as one
pinned ``custom_vjp`` each (``planner.apply``), so the compiled program recomputes a segment only
when the backward reaches it. For a fixed segmentation (σ: segment, b: bytes, c: FLOPs) this is
``remat.milp`` with one stage per segment, equations as units; x ranges over values and JVP
intermediates:

    minimise   Σ_e (c_e + 1)·r_e + ε·(P + Σ_x b_x·s_x)
    subject to s_x + r_{eqn(x)} ≥ 1             x a residual of an equation's backward
               s_x = 1                          x read by a later segment (a segment input)
               r_e ≤ s_w + r_{eqn(w)}           w an input of e in the same segment
               H_j = H_{j−1} + Σ_{σ(x)=j} b_x·s_x       saved bytes held at segment j's backward
               H_j + Σ_{σ(e)=j} b_e·r_e ≤ P ≤ budget    recomputed values live during it

with binary s, r, solved by scipy's HiGHS. The predicted peak P is the activation bytes the
backward holds at its fullest moment (arguments and the backward's own working buffers excluded).
Candidate segmentations: K = 1, 2, 3, 4, 6, 8, … parts of about equal bytes, each cut moved to
the narrowest point nearby (fewest bytes crossing it); LP bounds order them and prune. A solve
that hits its time limit keeps HiGHS's incumbent; with none, the stated heuristic (recompute
everything a segment's backward reads from the segment's inputs) is used; the optimality gap is
reported either way.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.milp import Plan, StagedMILP
from mlsys_jax.remat.planner.flat import flatten_loss
from mlsys_jax.remat.planner.graph import LossGraph, loss_graph

MIP_GAP = 1e-2       # HiGHS stops within 1% of the optimum; the gap reached is reported
HEURISTIC = "heuristic: save segment inputs, recompute all else the backward reads"


@dataclass(frozen=True)
class _Candidate:
    bounds: tuple[int, ...]
    s: np.ndarray                    # saved: values, then JVP bundles
    r: np.ndarray                    # recomputed equations
    peak: float
    flops: float
    objective: float
    method: str
    gap: float


def segmentations(g: LossGraph, max_k: int = 64) -> list[tuple[int, ...]]:
    """Candidate cuts: K parts of about equal bytes, each cut at the narrowest point nearby."""
    n = g.n_eqns
    cum = np.concatenate([[0.0], np.cumsum(np.bincount(g.eqn_of, g.nbytes, minlength=n))])
    delta = np.zeros(n + 2)           # cross[p]: bytes made before equation p, read at or after
    used = g.last_use > g.eqn_of
    np.add.at(delta, g.eqn_of[used] + 1, g.nbytes[used])
    np.add.at(delta, g.last_use[used] + 1, -g.nbytes[used])
    cross = np.cumsum(delta)
    ks, k = [], 1.0
    while round(k) <= max(1, min(n // 2, max_k)):      # K = 1, 2, 3, 4, 6, 8, 11, 15, …
        ks.append(round(k))
        k = k + 1 if k < 4 else k * 1.4
    out = []
    for k in dict.fromkeys(ks):
        cuts, window = [0], max(1, n // (4 * k))
        for t in range(1, k):
            p = int(np.searchsorted(cum, cum[-1] * t / k))
            near = np.arange(max(cuts[-1] + 1, p - window), min(n - 1, p + window) + 1)
            if near.size:
                cuts.append(int(near[np.lexsort((np.abs(near - p), cross[near]))[0]]))
        if tuple(cuts) not in out:
            out.append(tuple(cuts))
    return out


class SegmentedProblem:
    """The MILP data of one loss; ``solve(peak_budget_bytes)`` plans within a predicted peak P,
    ``min_peak_budget_bytes`` is the least P."""

    def __init__(self, graph: LossGraph, time_limit_s: float = 20.0):
        self.graph, self.time_limit_s = graph, time_limit_s
        eqns = graph.closed.jaxpr.eqns
        self.inputs = [tuple(sorted({graph.value_of[w] for w in e.invars
                                     if not isinstance(w, Literal) and w in graph.value_of}))
                       for e in eqns]
        self.reads, tmp = [], []                  # values each backward reads; JVP bundles
        for i, (e, info) in enumerate(zip(eqns, graph.vjps)):
            if info is None:
                continue
            ref = [e.invars[j] if kind == "in" else e.outvars[j] for kind, j in info.leaves
                   if kind != "tmp"]
            self.reads.append((i, tuple(graph.value_of[w] for w in ref
                                        if not isinstance(w, Literal) and w in graph.value_of)))
            if info.tmp_bytes:
                tmp.append((i, info.tmp_bytes))
        self.tmp_eqns = np.array([i for i, _ in tmp], dtype=np.int64)
        self.tmp_bytes = np.array([b for _, b in tmp], dtype=np.float64)
        self.tmp_col = {i: t for t, (i, _) in enumerate(tmp)}
        self.eqn_bytes = np.bincount(graph.eqn_of, graph.nbytes, minlength=graph.n_eqns)
        self.eqn_bytes[self.tmp_eqns] += self.tmp_bytes
        self.cuts = segmentations(graph)
        every = self._heuristic((0,), keep_all=True)
        self.store_all_bytes = int(every.peak)
        self._least: _Candidate | None = None

    @property
    def n_saveable(self) -> int:
        return self.graph.n_values + len(self.tmp_eqns)

    def _segments(self, bounds):
        g = self.graph
        seg_e = np.searchsorted(np.asarray(bounds), np.arange(g.n_eqns), side="right") - 1
        nxt = np.append(np.asarray(bounds[1:]), g.n_eqns)[seg_e[g.eqn_of]]
        return seg_e, g.last_use >= nxt            # crossing: read by a later segment

    def _model(self, bounds) -> StagedMILP:
        """The MILP for one segmentation: items are values then JVP bundles, units equations."""
        g = self.graph
        nv = g.n_values
        seg_e, crossing = self._segments(bounds)
        covers = []
        for e, leaves in self.reads:
            covers += [(v, g.eqn_of[v]) for v in set(leaves) if not crossing[v]]
            if e in self.tmp_col:
                covers.append((nv + self.tmp_col[e], e))
        needs = [(e, v, g.eqn_of[v]) for e in range(g.n_eqns) for v in self.inputs[e]
                 if not crossing[v]]
        return StagedMILP(np.concatenate([g.nbytes, self.tmp_bytes]),
                          np.concatenate([seg_e[g.eqn_of], seg_e[self.tmp_eqns]]),
                          np.concatenate([crossing, np.zeros(len(self.tmp_eqns), bool)]),
                          g.eqn_flops, self.eqn_bytes, seg_e, tuple(covers), tuple(needs),
                          n_stages=len(bounds))

    def _solve(self, bounds, budget: float | None, relax: bool = False):
        """Fewest recompute FLOPs within ``budget`` (None: the least peak) for one segmentation;
        with ``relax``, the LP relaxation's objective (a lower bound; inf if infeasible)."""
        model = self._model(bounds)
        sol = model.solve(budget, self.time_limit_s, MIP_GAP, relax)
        if relax:                      # infeasible: inf; out of time: no bound (0)
            return sol.objective if sol.objective is not None else 0.0
        if not sol.found:                                  # time limit without a plan
            heur = self._heuristic(bounds)
            if budget is not None and heur.peak > budget:
                return None
            value = heur.objective if budget is not None else heur.peak / model.total_bytes
            gap = 1.0 if sol.bound is None or value <= 0 else max(0.0, (value - sol.bound) / value)
            return _Candidate(bounds, heur.s, heur.r, heur.peak, heur.flops, value, HEURISTIC, gap)
        method = "MILP (HiGHS)" if sol.status == 0 else "MILP (HiGHS), time limit: best found"
        return _Candidate(bounds, sol.s, sol.r, model.peak(sol.s, sol.r),
                          float(self.graph.eqn_flops[sol.r].sum()), sol.objective, method, sol.gap)

    def _peak(self, bounds, s, r) -> float:
        return self._model(bounds).peak(s, r)

    def _heuristic(self, bounds, keep_all: bool = False) -> _Candidate:
        """Save segment inputs and recompute the rest (``keep_all``: save every residual)."""
        g = self.graph
        seg_e, crossing = self._segments(bounds)
        s = np.concatenate([crossing, np.zeros(len(self.tmp_eqns), bool)])
        r = np.zeros(g.n_eqns, bool)
        for e, leaves in self.reads:
            for v in leaves:
                if not crossing[v]:
                    s[v] |= keep_all
                    r[g.eqn_of[v]] |= not keep_all
            if e in self.tmp_col:
                s[g.n_values + self.tmp_col[e]] |= keep_all
                r[e] |= not keep_all
        for e in range(g.n_eqns - 1, -1, -1):          # inputs come before their users
            if r[e]:
                for v in self.inputs[e]:
                    r[g.eqn_of[v]] |= not crossing[v]
        flops = float(g.eqn_flops[r].sum())
        method, gap = ("no recompute needed", 0.0) if keep_all else (HEURISTIC, 1.0)
        return _Candidate(bounds, s, r, self._peak(bounds, s, r), flops, flops + r.sum(),
                          method, gap)

    def _best(self, budget: float | None) -> _Candidate | None:
        """Branch and bound over segmentations: LP bounds first, MILPs in their order."""
        lower = {b: self._solve(b, budget, relax=True) for b in self.cuts}
        best = None
        for b in sorted(self.cuts, key=lambda b: (lower[b], len(b))):
            if lower[b] == np.inf or best is not None and lower[b] >= best.objective * (1 - MIP_GAP):
                break               # no segmentation left can beat the best by more than the gap
            found = self._solve(b, budget)
            if found is not None and (best is None or found.objective < best.objective):
                best = found
        return best

    @property
    def min_peak_budget_bytes(self) -> int:
        """The least predicted peak over every segmentation (everything else recomputed); never
        above store-all's, which every segmentation can reach."""
        if self._least is None:
            found = self._best(None)
            every = self._heuristic((0,), keep_all=True)
            self._least = every if found is None or found.peak > every.peak else found
        return int(np.ceil(self._least.peak))

    def solve(self, peak_budget_bytes: int) -> Plan:
        """The plan with the fewest recompute FLOPs whose predicted peak fits ``peak_budget_bytes``
        (the MILP's P; ``Frontier`` budgets compiled temp bytes instead)."""
        g, t0 = self.graph, time.perf_counter()
        if peak_budget_bytes >= self.store_all_bytes:
            best = self._heuristic((0,), keep_all=True)
        else:
            best = self._best(float(peak_budget_bytes))
            if best is None:            # no segmentation fits: is the budget below the least?
                least = self.min_peak_budget_bytes
                if peak_budget_bytes < least:
                    raise MlsysError(f"plan: peak_budget_bytes={peak_budget_bytes} is below the "
                                     f"minimum feasible {least} bytes (every segmentation tried, "
                                     f"everything recomputed); raise the budget to at least "
                                     f"{least}")
                best = self._least
        eqns = g.closed.jaxpr.eqns
        names = np.array(list(g.names) + [f"{eqns[e].primitive.name}_{e}.jvp"
                                          for e in self.tmp_eqns])
        recomputed = [n for n, e in zip(g.names, g.eqn_of) if best.r[e]]
        least = None if self._least is None else self.min_peak_budget_bytes
        return Plan(int(peak_budget_bytes), best.bounds, tuple(names[best.s]), tuple(recomputed),
                    int(np.ceil(best.peak)), int(best.flops), least, self.store_all_bytes,
                    g.n_values, time.perf_counter() - t0, best.method, best.gap)


    def timeline(self, plan: Plan) -> tuple[list[float], list[float]]:
        """The planner's model of activation bytes held over the step, as (position, bytes):
        the forward (equation by equation, saved values accumulating), then each segment's
        backward, last to first (its saved bytes and recomputed values live, then freed)."""
        g = self.graph
        eqns = g.closed.jaxpr.eqns
        names = list(g.names) + [f"{eqns[e].primitive.name}_{e}.jvp" for e in self.tmp_eqns]
        saved = np.isin(np.array(names), np.array(plan.saved, dtype=object))
        recomputed = set(plan.recomputed)
        r = np.zeros(g.n_eqns, bool)
        r[[e for n, e in zip(g.names, g.eqn_of) if n in recomputed]] = True
        model = self._model(plan.segments)
        made = np.concatenate([g.eqn_of, self.tmp_eqns])
        held = np.cumsum(np.bincount(made[saved], model.item_bytes[saved], minlength=g.n_eqns))
        xs, ys = list(range(g.n_eqns)), [float(b) for b in held]
        per_stage = np.cumsum(np.bincount(model.item_stage[saved], model.item_bytes[saved],
                                          minlength=model.n_stages))
        live = np.bincount(model.unit_stage[r], model.unit_bytes[r], minlength=model.n_stages)
        ends = list(plan.segments[1:]) + [g.n_eqns]
        for j in range(model.n_stages - 1, -1, -1):
            x0, x1 = 2 * g.n_eqns - ends[j], 2 * g.n_eqns - plan.segments[j]
            xs += [x0, x1]
            ys += [float(per_stage[j] + live[j])] * 2
        return xs + [2 * g.n_eqns], ys + [0.0]


def problem(loss_fn, params, batch, time_limit_s: float = 20.0) -> SegmentedProblem:
    """Trace ``loss_fn(params, batch)`` and build its MILP (the budget is left open)."""
    return SegmentedProblem(loss_graph(flatten_loss(loss_fn, params, batch, "plan")),
                            time_limit_s)
