"""The recomputation MILP: what to save and what to recompute, in stages (lecture §7.2; Checkmate).

Checkmate (Jain et al. 2020) decides per stage which values to recompute, store or free. Both
planners here use one reduction of it, with one recompute stage per part of the program:

* *items* x can be saved — s_x = 1: held from the forward until its stage's backward (b_x bytes);
* *units* e can be recomputed — r_e = 1: re-run in its stage's backward (c_e FLOPs, l_e bytes
  live while that backward runs);
* stages j = 0 … K−1 run their backward last to first, so stage j's backward still holds every
  item saved for stages ≤ j.

    minimise   Σ_e (c_e + 1)·r_e + ε·(P + Σ_x b_x·s_x)           (ε: a tie-break below one FLOP)
    subject to s_x + r_e ≥ 1                for each cover (x, e): a backward reads x, e makes it
               r_e ≤ s_x + r_f              for each need (e, x, f): e reads x, which f makes
               s_x = 1                      x forced (read by a later stage)
               H_j = H_{j−1} + Σ_{σ(x)=j} b_x·s_x                 bytes held at stage j's backward
               H_j + Σ_{σ(e)=j} l_e·r_e ≤ P ≤ budget − offset

with binary s, r. Experiment 03's two-stage view (``two_stage``) is one stage whose units are the
values themselves (l = 0, offset = the arguments); the users' planner (``planner.segments``) has one
stage per segment, equations as units and JVP intermediates among the items. Without a budget the
MILP minimises P instead (the least peak). Bytes enter the rows in units of the items' total, so
that HiGHS's tolerances (about 1e-7, absolute) see coefficients of order one: with rows in raw
bytes a peak objective's coefficient (1/total bytes) falls below them and HiGHS stops at any P,
up to twice the store-all peak. Both return a ``Plan``: the decision, what it predicts,
and (filled by the planner) what the compiled program measured.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsys_jax.errors import MlsysError

TIE = 0.25           # ε·total bytes: all tie-breaks together stay below one FLOP of recomputation


def solver():
    """scipy's ``milp`` (HiGHS) and its sparse matrices, or one line naming the extra to install."""
    try:
        from scipy import sparse
        from scipy.optimize import Bounds, LinearConstraint, milp
    except ImportError:
        raise MlsysError("plan: scipy is not installed; the MILP planner needs the 'solver' extra "
                         "(pip install -e '.[solver]')") from None
    return sparse, Bounds, LinearConstraint, milp


@dataclass(frozen=True)
class StagedMILP:
    """One instance of the MILP above (the budget is given to ``solve``)."""

    item_bytes: np.ndarray       # b_x
    item_stage: np.ndarray       # σ(x)
    forced: np.ndarray           # x must be saved
    unit_flops: np.ndarray       # c_e
    unit_bytes: np.ndarray       # l_e (0: not counted at the peak)
    unit_stage: np.ndarray       # σ(e)
    covers: tuple                # (x, e) pairs
    needs: tuple                 # (e, x, f) triples
    n_stages: int = 1
    offset_bytes: float = 0.0    # held whatever the plan (not a decision)

    @property
    def total_bytes(self) -> float:
        """Every item's bytes: the unit of the tie-break (and of the peak objective)."""
        return max(float(self.item_bytes.sum()), 1.0)

    def peak(self, s: np.ndarray, r: np.ndarray) -> float:
        """P of a decision (offset excluded): the most bytes any stage's backward holds."""
        k = self.n_stages
        held = np.cumsum(np.bincount(self.item_stage[s], self.item_bytes[s], minlength=k))
        return float((held + np.bincount(self.unit_stage[r], self.unit_bytes[r], minlength=k)).max())

    def _matrix(self):
        """Rows over the columns s (items) | r (units) | H (stages) | P; bytes in total units."""
        sparse = solver()[0]
        nx, ne, k = len(self.item_bytes), len(self.unit_flops), self.n_stages
        r0, h0, scale = nx, nx + ne, 1.0 / self.total_bytes
        rows, cols, vals, lo, hi = [], [], [], [], []

        def row(entries, low, high):
            for c, v in entries:
                rows.append(len(lo)), cols.append(c), vals.append(v)
            lo.append(low), hi.append(high)

        for x, e in self.covers:
            row([(x, 1), (r0 + e, 1)], 1, np.inf)
        for e, x, f in self.needs:
            row([(r0 + e, 1), (x, -1), (r0 + f, -1)], -np.inf, 0)
        for j in range(k):
            held = [(x, -b * scale) for x, b in zip(np.flatnonzero(self.item_stage == j),
                                                    self.item_bytes[self.item_stage == j])]
            row([(h0 + j, 1)] + ([(h0 + j - 1, -1)] if j else []) + held, 0, 0)
            live = [(r0 + e, b * scale) for e, b in zip(np.flatnonzero(self.unit_stage == j),
                                                        self.unit_bytes[self.unit_stage == j])]
            row([(h0 + j, 1), (h0 + k, -1)] + live, -np.inf, 0)
        matrix = sparse.csr_array((vals, (rows, cols)), shape=(len(lo), nx + ne + k + 1))
        return matrix, np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)

    def solve(self, peak_budget_bytes: float | None, time_limit_s: float | None = None,
              gap: float = 1e-4, relax: bool = False) -> "Solution":
        """Fewest recompute FLOPs with P ≤ ``peak_budget_bytes`` − offset (None: the least P), within
        the relative ``gap`` and ``time_limit_s`` (None: none). ``relax`` solves the LP relaxation
        (its objective bounds the MILP's from below)."""
        _, Bounds, LinearConstraint, milp = solver()
        nx, ne, k = len(self.item_bytes), len(self.unit_flops), self.n_stages
        total = self.total_bytes
        if peak_budget_bytes is None:
            cost = np.concatenate([np.zeros(nx + ne + k), [1.0]])
            top = np.inf
        else:
            cost = np.concatenate([TIE * self.item_bytes / total, self.unit_flops + 1.0,
                                   np.zeros(k), [TIE]])
            top = (peak_budget_bytes - self.offset_bytes) / total
        matrix, lo, hi = self._matrix()
        low = np.concatenate([self.forced.astype(np.float64), np.zeros(ne + k + 1)])
        high = np.concatenate([np.ones(nx + ne), np.full(k, np.inf), [top]])
        if top < 0:
            return Solution(None, None, np.inf, 2, 0.0, None)
        res = milp(cost, integrality=np.concatenate([np.full(nx + ne, 0 if relax else 1),
                                                     np.zeros(k + 1)]),
                   bounds=Bounds(low, high), constraints=LinearConstraint(matrix, lo, hi),
                   options={"mip_rel_gap": gap,
                            **({} if time_limit_s is None else {"time_limit": time_limit_s})})
        if res.x is None:
            return Solution(None, None, np.inf if res.status == 2 else None, res.status, 1.0,
                            getattr(res, "mip_dual_bound", None))
        s, r = res.x[:nx] > 0.5, res.x[nx:nx + ne] > 0.5
        return Solution(s, r, float(res.fun), res.status,
                        float(getattr(res, "mip_gap", 0.0) or 0.0),
                        getattr(res, "mip_dual_bound", None))


@dataclass(frozen=True)
class Solution:
    """HiGHS's answer: the decision (None if it found none), its objective and status."""

    s: np.ndarray | None         # items saved
    r: np.ndarray | None         # units recomputed
    objective: float | None      # inf: infeasible; None: out of time without a point
    status: int                  # scipy's: 0 optimal, 1 time limit, 2 infeasible
    gap: float                   # HiGHS's optimality gap (relative, in the objective)
    bound: float | None          # HiGHS's dual bound

    @property
    def found(self) -> bool:
        """Whether the solver found a feasible plan."""
        return self.s is not None


@dataclass(frozen=True)
class Plan:
    """Which values are saved and which recomputed, in which segments, and what it predicts."""

    peak_budget_bytes: int           # the MILP's budget: a predicted peak (solve)
    segments: tuple[int, ...]        # first equation of each segment: (0,) is one segment
    saved: tuple[str, ...]           # values, and JVP intermediates (``tanh_12.jvp``)
    recomputed: tuple[str, ...]      # values whose equations re-run in the backward
    predicted_peak_bytes: int        # two_stage: arguments + saved; planner: backward's residuals
    recompute_flops: int
    min_peak_budget_bytes: int | None  # the least predicted peak any plan reaches (None: unknown)
    store_all_bytes: int             # every residual saved: the predicted peak without remat
    n_values: int
    solve_seconds: float
    method: str = "MILP (HiGHS)"
    optimality_gap: float = 0.0      # (plan − lower bound) / plan, in the MILP's objective
    compiled_temp_bytes: int | None = None   # measured by ``planner.frontier`` (XLA's temp buffers)
    compiled_flops: float | None = None
    pin: str | None = "recomputation"  # what a segment pins (planner.apply): "recomputation" or
    #                                    "backward"; None: not pinned (two_stage's names policy)
    budget_bytes: int | None = None    # the user's budget, XLA temp bytes, that a Frontier met
    min_budget_bytes: int | None = None  # the least compiled temp bytes a Frontier found
    scan_policy: str | None = None     # a plan that checkpoints scan bodies under this policy
    #                                    (planner.scan_bodies; ``recomputed``: those scans)


def plan_key(p: Plan) -> tuple:
    """What makes two plans the same program: segments, saved and recomputed values, the pin
    (and the policy of checkpointed scan bodies)."""
    return p.segments, p.saved, p.recomputed, p.pin, p.scan_policy
