"""The recomputation MILP against brute force on small random instances, at any byte scale."""
import itertools

import numpy as np
import pytest

from mlsys_jax.remat.milp import StagedMILP

pytest.importorskip("scipy")


def random_instance(rng, n=5, stages=2, scale=1.0):
    """Values 0..n-1 in order, each made by its own unit; a random DAG of reads."""
    stage = np.sort(rng.integers(0, stages, n))
    reads = [sorted(set(rng.integers(0, i, rng.integers(1, 3)).tolist())) if i else []
             for i in range(n)]
    crossing = np.array([any(stage[j] > stage[i] for j in range(n) if i in reads[j])
                         for i in range(n)])
    covers = tuple((i, i) for i in range(n) if not crossing[i] and rng.random() < 0.8)
    needs = tuple((j, i, i) for j in range(n) for i in reads[j] if not crossing[i])
    nbytes = rng.integers(1, 9, n) * scale
    return StagedMILP(nbytes.astype(float), stage, crossing, rng.integers(1, 50, n).astype(float),
                      nbytes.astype(float), stage, covers, needs, n_stages=stages)


def brute_force(m: StagedMILP, budget):
    """(least objective's FLOPs part, least peak) over every feasible decision."""
    n, best_flops, best_peak = len(m.item_bytes), np.inf, np.inf
    for bits in itertools.product((0, 1), repeat=2 * n):
        s, r = np.array(bits[:n], bool), np.array(bits[n:], bool)
        if (m.forced & ~s).any() or any(not (s[x] or r[e]) for x, e in m.covers) or \
                any(r[e] and not (s[x] or r[f]) for e, x, f in m.needs):
            continue
        peak = m.peak(s, r)
        best_peak = min(best_peak, peak)
        if peak <= budget:
            best_flops = min(best_flops, float((m.unit_flops[r] + 1).sum()))
    return best_flops, best_peak


@pytest.mark.parametrize("seed", range(12))
def test_solutions_are_optimal_and_feasible(seed):
    rng = np.random.default_rng(seed)
    m = random_instance(rng, scale=10.0 ** rng.integers(0, 9))    # 1 B … 100 MB per value
    _, least = brute_force(m, np.inf)
    low = m.solve(None)
    assert low.found and m.peak(low.s, low.r) == pytest.approx(least)
    budget = least + (m.item_bytes.sum() - least) * rng.random()
    flops, _ = brute_force(m, budget)
    sol = m.solve(budget, gap=0.0)
    assert m.peak(sol.s, sol.r) <= budget * (1 + 1e-9)
    assert float((m.unit_flops[sol.r] + 1).sum()) == pytest.approx(flops)


def test_below_the_least_peak_is_infeasible():
    m = random_instance(np.random.default_rng(0))
    least = m.peak(*(lambda s: (s.s, s.r))(m.solve(None)))
    assert not m.solve(least * 0.999).found and not m.solve(-1.0).found
