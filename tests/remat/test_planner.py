"""The segmented MILP planner on a non-chain graph: budgets, the minimum, the heuristic fallback,
and plans applied to a loss whose batch holds integer labels (gradients w.r.t. params only)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.s03_remat.milp import gated_residual_mlp, graph_inputs
from mlsys_jax.errors import MlsysError
from mlsys_jax.remat import apply, measure
from mlsys_jax.remat.planner.budget import parse_budget
from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.remat.planner.segments import HEURISTIC, problem
from tests.remat.remat_cases import labelled_loss

pytest.importorskip("scipy")


@pytest.fixture(scope="module")
def case():
    ws, x = graph_inputs(blocks=3, width=8, batch=64)
    batch = {"x": x, "y": jnp.arange(64) % 8, "mask": jnp.arange(64) % 3 > 0}
    return ws, batch, problem(labelled_loss, ws, batch)


def test_budgets_trade_recomputation_for_memory(case):
    _, _, prob = case
    least, full = prob.min_peak_budget_bytes, prob.store_all_bytes
    assert 0 < least < full
    last = None
    for budget in np.linspace(least, full, 4).astype(int):
        p = prob.solve(int(budget))
        assert p.predicted_peak_bytes <= budget and p.optimality_gap <= 0.01
        assert last is None or p.recompute_flops <= last      # more memory, never more FLOPs
        last = p.recompute_flops
    assert prob.solve(full).recomputed == () and prob.solve(least).recomputed
    with pytest.raises(MlsysError, match=f"below the minimum feasible {least} bytes"):
        prob.solve(least - 1)


def test_out_of_time_falls_back_to_the_stated_heuristic(case):
    ws, batch, _ = case
    slow = problem(labelled_loss, ws, batch, time_limit_s=0.0)
    p = slow.solve(slow.min_peak_budget_bytes)
    assert p.method == HEURISTIC and 0 < p.optimality_gap <= 1
    assert p.predicted_peak_bytes <= p.peak_budget_bytes


@pytest.mark.slow
def test_plans_compile_smaller_and_keep_the_gradient(case):
    ws, batch, prob = case
    p = prob.solve(prob.min_peak_budget_bytes)
    m = measure(labelled_loss, p, ws, batch)
    base = measure(labelled_loss, prob.solve(prob.store_all_bytes), ws, batch)
    assert m["compiled_temp_bytes"] < base["compiled_temp_bytes"]
    assert m["compiled_flops"] > base["compiled_flops"]          # the recomputation is kept
    assert m["grads_max_rel_diff"] < 1e-12                        # float64 here
    g = jax.jit(jax.grad(apply(labelled_loss, p, ws, batch)))(ws, batch)
    np.testing.assert_allclose(g, jax.grad(labelled_loss)(ws, batch), rtol=1e-12, atol=1e-15)


@pytest.mark.slow
def test_bad_plans_and_budgets_are_named(case):
    ws, batch, prob = case
    other = problem(gated_residual_mlp, ws, batch["x"]).solve(10**9)
    with pytest.raises(MlsysError, match="made for another function"):
        apply(labelled_loss, other, ws, batch)
    for bad in ("12x", "-5", True, "abc%"):
        with pytest.raises(MlsysError, match="budget must be a positive byte count"):
            parse_budget(bad)
    assert parse_budget("60%").value == 60.0 and parse_budget("2_000_000").value == 2000000
    assert parse_budget("0%").kind == "min"            # 0% asks for the least any plan reaches
    fr = Frontier(labelled_loss, ws, batch, ladder=(0.0,))
    with pytest.raises(MlsysError, match=f"below the minimum {fr.min_budget_bytes} bytes"):
        fr.plan(fr.min_budget_bytes - 1)
    with pytest.raises(MlsysError, match="cannot be differentiated"):
        problem(lambda p, b: jnp.sum(p["w"]) * p["n"], {"w": jnp.ones(3), "n": jnp.int32(2)}, {})
    with pytest.raises(MlsysError, match="one float scalar"):
        problem(lambda p, b: p * b, jnp.ones(3), jnp.ones(3))
