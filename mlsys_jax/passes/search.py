"""TASO-style cost-based backtracking search over the rewrite rules (lecture §4.4; TASO, SOSP'19).

A priority queue ordered by estimated cost; a candidate is kept when its cost is below
``alpha × best`` (α = 1.05 lets the search pass through a slightly worse graph, like §4.2 step ③);
graphs are deduplicated by structural hash, bounded by a budget of graphs and a size limit; every
accepted graph has passed the verifier (``passes.run``). With α = 1.0 it is greedy: only improving
steps, and it stops at step ②.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass

from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir import structural_hash
from mlsys_jax.ir.walk import walk
from mlsys_jax.passes.conv import candidates
from mlsys_jax.passes.manager import cost_summary, run
from mlsys_jax.passes.registry import search_moves


@dataclass(frozen=True)
class Step:
    """One rewrite on the path to a graph, with the cost after it."""

    rule: str
    detail: str
    kernels: int
    flops: int
    time_us: float


@dataclass(frozen=True)
class SearchResult:
    """The best graph found, how it was reached, and how much was explored."""

    best: ClosedJaxpr
    start: dict
    best_cost: dict
    path: tuple
    explored: int
    accepted: int
    seconds: float
    alpha: float

    def path_rows(self) -> list[dict]:
        rows = [{"step": 0, "rule": "(start)", "rewrite": "", **self.start}]
        return rows + [{"step": i + 1, "rule": s.rule, "rewrite": s.detail, "kernels": s.kernels,
                        "flops": s.flops, "time_us": s.time_us} for i, s in enumerate(self.path)]


def search(closed: ClosedJaxpr, alpha: float = 1.05, hw="h100", dtype="bf16", budget: int = 100,
           max_growth: float = 2.0, rules=None) -> SearchResult:
    """Search rewrite sequences for the cheapest graph under the cost model.

    Args:
      alpha: keep candidates costing less than ``alpha × best`` (≥ 1; 1.0 = greedy).
      budget: at most this many distinct graphs are generated.
      max_growth: skip graphs with more than this × the starting number of equations.
      rules: names of passes the registry marks as search moves (default: all of them).
    """
    if not isinstance(closed, ClosedJaxpr):
        raise MlsysError(f"search: expected a ClosedJaxpr, got {type(closed).__name__}")
    if not alpha >= 1.0:
        raise MlsysError(f"search: alpha must be ≥ 1.0 (1.0 = greedy), got {alpha}")
    if budget < 1:
        raise MlsysError(f"search: budget must be ≥ 1 graph, got {budget}")
    moves = search_moves(rules, source="search(rules=...)")
    t0 = time.perf_counter()
    start = cost_summary(closed, hw, dtype)
    size_limit = max_growth * sum(1 for _ in walk(closed))
    seen = {structural_hash(closed)}
    queue = [(start["time_us"], 0, closed, ())]
    best, best_cost, best_path = closed, start, ()
    explored, accepted, tick = 0, 0, 1
    while queue and explored < budget:
        _, _, graph, path = heapq.heappop(queue)
        for name, factory in moves.items():
            for k in range(candidates(factory, graph)):
                if explored >= budget:
                    break
                res = run(factory(only=k), graph, verify=True, hw=hw, dtype=dtype)
                if not res.changed:
                    continue
                new = res.jaxpr
                h = structural_hash(new)
                if h in seen or sum(1 for _ in walk(new)) > size_limit:
                    continue
                seen.add(h)
                explored += 1
                cost = res.log[-1].cost_after
                step = Step(name, "; ".join(r.detail for r in res.rewrites if r.detail),
                            cost["kernels"], cost["flops"], cost["time_us"])
                keep = cost["time_us"] < alpha * best_cost["time_us"]
                if cost["time_us"] < best_cost["time_us"]:
                    best, best_cost, best_path = new, cost, path + (step,)
                if keep:
                    accepted += 1
                    heapq.heappush(queue, (cost["time_us"], tick, new, path + (step,)))
                    tick += 1
    return SearchResult(best, start, best_cost, best_path, explored, accepted,
                        time.perf_counter() - t0, alpha)
