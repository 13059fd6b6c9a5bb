"""Optimal chain schedules under a memory budget (Revolve / rotor style dynamic program).

Model (the lecture's, §7.2): activations h_0..h_N with integer sizes a_i, layer i costs c_i to
run forward; the backward of layer i needs h_{i-1} and h_i live. Memory is the total size of live
h's, h_0 included; advancing from h_s keeps the running pair (h_{i-1}, h_i) live.

Two sub-problems on a segment [s, e], h_s live:
  F[s,e](m)  h_e not live — reverse layers s+1..e within budget m;
  G[s,e](m)  h_e live (counted in m), freed when done.
F advances to some k, keeps h_k, solves the right part (F[k,e] with m - a_s, since h_s stays
live), then the left part with its end live (G[s,k]). G does the same with G[k,e] on the right,
or frees h_e and becomes F. ``reuse_outputs=False`` forbids keeping an end for reuse (G = F, every
backward re-runs its layer forward): that is Revolve's convention, where the closed form
``revolve_advances`` holds (Griewank & Walther 2000): with s checkpoint slots and l steps,
t·l − C(s+t, t−1) advances, t the least integer with C(s+t, s) ≥ l.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.chain.schedule import Action, Schedule

INF = np.inf


@dataclass(frozen=True)
class ChainDP:
    """Solved tables: ``forwards(budget)`` is the optimum cost, ``schedule(budget)`` the program."""

    n: int
    sizes: tuple[int, ...]
    costs: tuple[float, ...]
    reuse_outputs: bool
    F: np.ndarray          # F[s, e, m]
    G: np.ndarray          # G[s, e, m]
    choice_f: np.ndarray   # k chosen by F (e means "advance to the end, then G")
    choice_g: np.ndarray   # k chosen by G (0 means "free the end, then F")

    @property
    def min_budget(self) -> int:
        """The smallest memory budget that has any schedule (-1 if none up to the solved maximum)."""
        feasible = np.flatnonzero(np.isfinite(self.F[0, self.n]))
        return int(feasible[0]) if feasible.size else -1

    def forwards(self, budget: int) -> float:
        """The fewest (cost-weighted) forwards achievable within ``budget``."""
        return float(self.F[0, self.n, min(budget, self.F.shape[2] - 1)])

    def schedule(self, budget: int) -> Schedule:
        """The optimal program for ``budget`` (memory units), with its jax_plan."""
        if budget < self.min_budget:
            raise MlsysError(f"optimal_chain: budget {budget} is below the minimum feasible "
                             f"{self.min_budget} for N={self.n}; raise the budget to at least that")
        m = min(budget, self.F.shape[2] - 1)
        acts: list[Action] = []
        plan = self._emit_f(0, self.n, m, acts)
        return Schedule(f"optimal(M={budget})", self.n, tuple(acts), _merge_runs(plan))

    def _advance(self, s: int, k: int, acts: list[Action]) -> None:
        for i in range(s + 1, k + 1):
            acts.append(("fwd", i))
            if i - 1 != s:
                acts.append(("free", i - 1))

    def _emit_f(self, s: int, e: int, m: int, acts: list[Action]) -> tuple:
        if e - s == 1:
            acts += [("fwd", e), ("bwd", e), ("free", e)]
            return (1,)
        k = int(self.choice_f[s, e, m])
        self._advance(s, k, acts)
        if k == e:
            return self._emit_g(s, e, m, acts)
        right = self._emit_f(k, e, m - self.sizes[s], acts)
        left = self._emit_g(s, k, m, acts)
        return (_remat(left, k - s),) + right

    def _emit_g(self, s: int, e: int, m: int, acts: list[Action]) -> tuple:
        if e - s == 1 and self.reuse_outputs:
            acts += [("bwd", e), ("free", e)]
            return (1,)
        k = int(self.choice_g[s, e, m])
        if k == 0:
            acts.append(("free", e))
            return self._emit_f(s, e, m, acts)
        self._advance(s, k, acts)
        right = self._emit_g(k, e, m - self.sizes[s], acts)
        left = self._emit_g(s, k, m, acts)
        return (_remat(left, k - s),) + right


def _remat(plan: tuple, length: int):
    # a one-layer left part has no interior to recompute: its residuals are simply kept
    return length if length == 1 else ("remat", _merge_runs(plan))


def _merge_runs(plan: tuple) -> tuple:
    out: list = []
    for p in plan:
        if isinstance(p, int) and out and isinstance(out[-1], int):
            out[-1] += p
        else:
            out.append(p)
    return tuple(out)


def _shift(arr: np.ndarray, d: int) -> np.ndarray:
    """out[..., m] = arr[..., m - d] (inf where m - d < 0)."""
    out = np.full_like(arr, INF)
    if d < arr.shape[-1]:
        out[..., d:] = arr[..., :arr.shape[-1] - d]
    return out


def solve_chain(n: int, costs=None, sizes=None, max_budget: int | None = None,
                reuse_outputs: bool = True) -> ChainDP:
    """Fill the F/G tables for budgets 0..max_budget (default: store-all's memory)."""
    if not isinstance(n, int) or n < 1:
        raise MlsysError(f"optimal_chain: n must be a positive int, got {n!r}")
    c = np.ones(n) if costs is None else np.asarray(costs, dtype=np.float64)
    a = np.ones(n + 1, dtype=np.int64) if sizes is None else np.asarray(sizes)
    if c.shape != (n,) or np.any(c < 0):
        raise MlsysError(f"optimal_chain: costs must be {n} non-negative numbers (one per layer)")
    if a.shape != (n + 1,) or a.dtype.kind not in "iu" or np.any(a < 1):
        raise MlsysError(f"optimal_chain: sizes must be {n + 1} positive ints (h_0..h_N, memory units)")
    top = int(a.sum()) + 2 if max_budget is None else int(max_budget)
    if (n + 1) ** 2 * (top + 1) > 60_000_000:     # four (N+1)² × budgets tables must fit in RAM
        raise MlsysError(f"optimal_chain: N={n} with budgets up to {top} units needs "
                         f"{4 * (n + 1) ** 2 * (top + 1) * 6 / 1e9:.1f} GB of DP tables; pass a "
                         "smaller max_budget or coarser sizes (memory units)")
    ms = np.arange(top + 1)
    cum = np.concatenate([[0.0], np.cumsum(c)])
    F = np.full((n + 1, n + 1, top + 1), INF)
    G = np.full_like(F, INF)
    cf = np.zeros(F.shape, dtype=np.int32)
    cg = np.zeros(F.shape, dtype=np.int32)
    # adv[s, k]: memory while advancing h_s -> h_k (h_s plus the running pair)
    adv = np.zeros((n + 1, n + 1), dtype=np.int64)
    for s in range(n):
        run = 0
        for k in range(s + 1, n + 1):
            run = max(run, a[k] if k == s + 1 else a[k - 1] + a[k])
            adv[s, k] = a[s] + run
    for length in range(1, n + 1):
        for s in range(0, n - length + 1):
            e = s + length
            pair = a[s] + a[e]
            if length == 1:
                F[s, e] = np.where(ms >= pair, c[e - 1], INF)
                G[s, e] = np.where(ms >= pair, 0.0, INF) if reuse_outputs else F[s, e]
                continue
            ks = np.arange(s + 1, e)
            step = (cum[ks] - cum[s])[:, None]
            fits = ms[None, :] >= adv[s, ks][:, None]
            if reuse_outputs:   # G without "free the end" first (that option needs F[s, e])
                cand = step + _shift(G[ks, e], int(a[s])) + G[s, ks]
                cand = np.where(fits & (ms[None, :] >= (adv[s, ks] + a[e])[:, None]), cand, INF)
                g_best, g_k = cand.min(axis=0), ks[cand.argmin(axis=0)]
                G[s, e], cg[s, e] = g_best, np.where(np.isfinite(g_best), g_k, 0)
            cand = step + _shift(F[ks, e], int(a[s])) + G[s, ks]
            cand = np.where(fits, cand, INF)
            whole = np.where(ms >= adv[s, e], cum[e] - cum[s] + G[s, e], INF)
            cand = np.vstack([cand, whole]) if reuse_outputs else cand
            kk = np.append(ks, e) if reuse_outputs else ks
            F[s, e], cf[s, e] = cand.min(axis=0), kk[cand.argmin(axis=0)]
            if reuse_outputs:
                use_f = F[s, e] < G[s, e]
                G[s, e] = np.where(use_f, F[s, e], G[s, e])
                cg[s, e] = np.where(use_f, 0, cg[s, e])
            else:
                G[s, e], cg[s, e] = F[s, e], 0
    return ChainDP(n, tuple(int(v) for v in a), tuple(float(v) for v in c), reuse_outputs,
                   F, G, cf, cg)


def optimal_chain(n: int, budget: int, costs=None, sizes=None,
                  reuse_outputs: bool = True) -> Schedule:
    """The schedule with the fewest (cost-weighted) layer forwards whose peak fits ``budget``.

    ``budget`` counts memory units (activations when ``sizes`` is None), h_0 included.
    """
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise MlsysError(f"optimal_chain: budget must be an int (memory units), got {budget!r}")
    dp = solve_chain(n, costs, sizes, max_budget=max(budget, 3), reuse_outputs=reuse_outputs)
    return dp.schedule(budget)


def revolve_advances(steps: int, slots: int) -> int:
    """Griewank & Walther's closed form: minimal forward advances to reverse ``steps`` steps
    with ``slots`` checkpoints (the taped forward inside each reverse step not counted)."""
    if steps < 1 or slots < 1:
        raise MlsysError("revolve_advances: steps and slots must be >= 1")
    t = 0
    while math.comb(slots + t, slots) < steps:
        t += 1
    return t * steps - math.comb(slots + t, t - 1) if t else 0
