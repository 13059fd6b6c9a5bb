"""Budgets met on the compiled program, plans chosen by measured time, policies judged on bytes and
time: a labelled gated residual MLP in float32, as a user's model runs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.s03_remat.milp import graph_inputs
from mlsys_jax import timing
from mlsys_jax.remat.milp import plan_key
from mlsys_jax.remat.planner.frontier import MAX_PROBES, Frontier
from mlsys_jax.remat.planner.policies import verdict
from tests.remat.remat_cases import labelled_loss

pytest.importorskip("scipy")


def _frontier():
    with jax.enable_x64(False):
        ws, x = graph_inputs(blocks=4, width=16, batch=128)
        batch = {"x": x.astype(jnp.float32), "y": jnp.arange(128) % 16}
        return Frontier(labelled_loss, ws.astype(jnp.float32), batch, repeats=3,
                        timing_budget_s=1.0)


@pytest.fixture
def fresh():
    return _frontier()


@pytest.fixture(scope="module")
def frontier():
    """One frontier for the tests below: each asks the same budgets, so the plans they compile
    do not depend on the order the tests run in."""
    return _frontier()


def _mid(fr):
    return (fr.min_budget_bytes + fr.no_remat.compiled_temp_bytes) // 2


@pytest.mark.slow
def test_a_budget_no_remat_fits_returns_no_remat_and_compiles_nothing_else(fresh):
    with jax.enable_x64(False):
        for budget in ("100%", "150%", fresh.no_remat.compiled_temp_bytes):
            p = fresh.plan(budget)
            assert plan_key(p) == plan_key(fresh.no_remat) and p.recomputed == ()
            assert fresh.step_time_ratio(p) == 1.0
    assert len(fresh.measured) == 1 and len(fresh.programs.by_label) == 1


@pytest.mark.slow
def test_a_tighter_budget_compiles_plans_that_bracket_it_and_the_fastest_wins(frontier):
    with jax.enable_x64(False):
        budget = _mid(frontier)
        p = frontier.plan(budget)
        assert p.compiled_temp_bytes <= budget and p.recomputed and p.budget_bytes == budget
        assert len(frontier.measured) <= 3 + MAX_PROBES     # no remat, the least two, probes
        fits = [q for q in frontier.fitting(budget) if frontier.step_time_ratio(q) is not None]
        fastest = min(fits, key=frontier.step_time_ratio)
        if "indistinguishable" in frontier.choice:   # overlapping rounds: the fewest FLOPs
            r = frontier.timings[plan_key(fastest)]
            close = [q for q in fits if frontier.timings[plan_key(q)].low <= r.high
                     and frontier.timings[plan_key(q)].high >= r.low]
            assert p.compiled_flops == min(q.compiled_flops for q in close)
        else:
            assert frontier.step_time_ratio(p) == frontier.step_time_ratio(fastest)
        assert frontier.program(p).grads_max_rel_diff < 1e-6      # float32, against jax.grad
        least = frontier.plan("min")
        assert least.compiled_temp_bytes == min(q.compiled_temp_bytes for q in frontier.measured)
        assert least.compiled_temp_bytes <= p.compiled_temp_bytes
    assert frontier.problem.min_peak_budget_bytes <= frontier.problem.store_all_bytes


@pytest.mark.slow
def test_the_timed_frontier_has_no_point_larger_and_slower_than_another(frontier):
    with jax.enable_x64(False):
        frontier.plan(_mid(frontier))
        points = frontier.points
    ratios = [frontier.step_time_ratio(p) for p in points]
    temps = [p.compiled_temp_bytes for p in points]
    assert temps == sorted(temps) and all(a > b for a, b in zip(ratios, ratios[1:]))
    assert all(frontier.step_time_ratio(p) is not None for p in frontier.measured)


@pytest.mark.slow
def test_a_budget_below_the_least_names_it(frontier):
    from mlsys_jax.errors import MlsysError

    with jax.enable_x64(False), pytest.raises(MlsysError, match=r"below the minimum (\d+) bytes "
                                                                r".* at least \1"):
        frontier.plan(1000)


def test_verdicts_follow_bytes_and_every_round():
    def ratio(*per_round):
        return timing.Ratio(float(np.median(per_round)), min(per_round), max(per_round))
    assert verdict(None)[0] is None                                   # no plan within its bytes
    assert verdict(ratio(1.05, 1.08, 1.2)) == (False, verdict(ratio(1.05, 1.08, 1.2))[1])
    assert "policy faster" in verdict(ratio(1.05, 1.08, 1.2))[1]
    assert verdict(ratio(0.97, 1.02, 1.3))[0] is True                 # within the noise
    assert verdict(ratio(0.8, 0.9, 0.95))[0] is True and "plan faster" in \
        verdict(ratio(0.8, 0.9, 0.95))[1]


def test_the_plan_docstring_example_runs():
    import doctest

    from mlsys_jax.remat.planner import frontier

    result = doctest.testmod(frontier)
    assert result.attempted > 0 and result.failed == 0
