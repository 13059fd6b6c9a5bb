"""Experiment 03's two-stage MILP on a non-chain graph: plans respected by JAX, budgets, bad input."""
import builtins

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.s03_remat.milp import gated_residual_mlp, graph_inputs
from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.two_stage import apply, measure, plan, problem

pytest.importorskip("scipy")


@pytest.fixture(scope="module")
def graph():
    ws, x = graph_inputs(blocks=2, width=8, batch=16)
    return ws, x, problem(gated_residual_mlp, ws, x)


@pytest.mark.slow
def test_plans_are_what_jax_saves_and_fit_the_budget(graph):
    ws, x, prob = graph
    free = prob.solve(2**62)
    assert free.recompute_flops == 0 and free.predicted_peak_bytes <= free.store_all_bytes
    ref = jax.jit(jax.grad(gated_residual_mlp, argnums=(0, 1)))(ws, x)
    last_flops = None
    for budget in np.linspace(prob.arg_bytes, free.predicted_peak_bytes, 3).astype(int):
        p = prob.solve(int(budget))
        m = measure(gated_residual_mlp, p, ws, x)
        assert set(m["saved_names"]) == set(p.saved)
        assert p.predicted_peak_bytes <= budget and m["peak_bytes"] <= budget
        assert all(np.array_equal(a, b) for a, b in zip(m["grads"], ref))
        if last_flops is not None:
            assert p.recompute_flops <= last_flops      # more memory never costs more recompute
        last_flops = p.recompute_flops
    assert prob.solve(prob.arg_bytes).saved == ()       # the minimum: recompute everything


@pytest.mark.slow
def test_apply_returns_the_same_loss(graph):
    ws, x, prob = graph
    p = prob.solve(prob.arg_bytes)
    assert float(apply(gated_residual_mlp, p, ws, x)(ws, x)) == float(gated_residual_mlp(ws, x))


def test_budget_below_minimum_says_the_minimum(graph):
    ws, x, prob = graph
    with pytest.raises(MlsysError, match=f"minimum feasible {prob.arg_bytes} bytes"):
        plan(gated_residual_mlp, ws, x, peak_budget_bytes=prob.arg_bytes - 1)


def test_non_differentiable_functions_are_rejected():
    x = jnp.ones((4, 3), dtype=jnp.float64)
    with pytest.raises(MlsysError, match="float scalar"):
        plan(lambda x: jnp.argmax(x), x, peak_budget_bytes=10**6)
    with pytest.raises(MlsysError, match="float scalar"):
        plan(lambda x: jnp.tanh(x), x, peak_budget_bytes=10**6)
    with pytest.raises(MlsysError, match="no float argument"):
        plan(lambda i: jnp.sum(i).astype(jnp.float64), jnp.arange(3), peak_budget_bytes=10**6)


def test_missing_scipy_is_a_clear_error(monkeypatch, graph):
    ws, x, _ = graph
    real_import = builtins.__import__

    def no_scipy(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError("No module named 'scipy'")
        return real_import(name, *a, **k)
    monkeypatch.setattr(builtins, "__import__", no_scipy)
    with pytest.raises(MlsysError, match="solver"):
        plan(gated_residual_mlp, ws, x, peak_budget_bytes=10**6)
