"""Remat schedules, the two executors and the optimal chain DP (lecture §7.2, exercise 5)."""
import math

import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat import (chain_inputs, every_k, input_only, optimal_chain, revolve_advances,
                             run_reference, solve_chain, sqrt_n, store_all)
from mlsys_jax.remat.chain.jax_exec import run_jax


@pytest.mark.parametrize("sched, stored, forwards", [
    (store_all(64), 65, 64), (every_k(64, 8), 16, 120), (input_only(64), 3, 2144),
    (store_all(100), 101, 100), (sqrt_n(100), 20, 190)])
def test_lecture_counts_dry_run_and_measured(sched, stored, forwards):
    c = sched.counts()
    assert (c.peak_activations, c.layer_forwards) == (stored, forwards)
    x, ws = chain_inputs(sched.n, width=4, batch=2)
    r = run_reference(sched, x, ws)
    assert (r.peak_activations, r.layer_forwards) == (stored, forwards)


def test_schedules_print_their_predictions():
    text = str(every_k(64, 8))
    assert "16 stored activations" in text and "120 layer forwards (56 extra)" in text
    assert "8 checkpoints" in text


def test_every_k_matches_the_formula_when_k_divides_n():
    for n in (12, 36, 64):
        for k in (k for k in range(1, n + 1) if n % k == 0):
            c = every_k(n, k).counts()
            assert c.peak_activations == n // k + k
            assert c.layer_forwards - n == (k - 1) * n // k
            assert c.checkpoints == n // k


def test_reference_gradients_bitwise_equal_and_correct():
    x, ws = chain_inputs(12)
    base = run_reference(store_all(12), x, ws)
    for s in [every_k(12, k) for k in (2, 3, 5, 12)] + [input_only(12), optimal_chain(12, 4)]:
        assert np.array_equal(run_reference(s, x, ws).grads, base.grads), s.name


def test_reference_rejects_a_program_that_reads_a_freed_value():
    from mlsys_jax.remat.chain.schedule import Schedule

    bad = Schedule("bad", 2, (("fwd", 1), ("free", 1), ("fwd", 2), ("bwd", 2)), (2,))
    x, ws = chain_inputs(2)
    with pytest.raises(MlsysError, match="h_1"):
        run_reference(bad, x, ws)


@pytest.mark.slow
def test_jax_executor_bitwise_and_its_convention():
    n = 6
    x, ws = chain_inputs(n)
    base = run_jax(store_all(n), x, ws, compile_memory=False)
    assert base.layer_forwards == n
    np.testing.assert_allclose(base.grads, run_reference(store_all(n), x, ws).grads,
                               rtol=1e-12, atol=1e-15)          # JAX vs NumPy: same math
    for s in (every_k(n, 2), every_k(n, 4)):
        r = run_jax(s, x, ws, compile_memory=False)
        assert np.array_equal(r.grads, base.grads), s.name
        assert r.layer_forwards == 2 * n          # JAX recomputes every segment whole
        assert r.saved_activation_units < base.saved_activation_units
    io = run_jax(input_only(n), x, ws, compile_memory=False)
    assert np.array_equal(io.grads, base.grads)
    assert io.layer_forwards == n * (n + 1) // 2   # layer_i ∘ remat(prefix): N(N+1)/2
    opt = run_jax(optimal_chain(n, 4), x, ws, compile_memory=False)
    assert np.array_equal(opt.grads, base.grads)


def test_optimal_dominates_every_k_and_runs_as_planned():
    n = 24
    dp = solve_chain(n)
    x, ws = chain_inputs(n, width=4, batch=2)
    base = run_reference(store_all(n), x, ws)
    for k in range(1, n + 1):
        c = every_k(n, k).counts()
        assert dp.forwards(c.peak_activations) <= c.layer_forwards
    for m in range(dp.min_budget, n + 2):
        r = run_reference(dp.schedule(m), x, ws)
        assert r.peak_activations <= m and r.layer_forwards == dp.forwards(m)
        assert np.array_equal(r.grads, base.grads)


def test_optimal_matches_revolve_closed_form():
    # Revolve convention: every backward re-runs its layer; budget = slots + 2 activations.
    dp = solve_chain(64, reuse_outputs=False, max_budget=20)
    for steps in range(1, 65):
        for slots in range(1, 17):
            # F[0, steps] is the optimum for a chain of `steps` layers (uniform chain)
            assert dp.F[0, steps, slots + 2] - steps == revolve_advances(steps, slots)
    assert revolve_advances(64, 8) == 137 and revolve_advances(64, 16) == 110
    assert revolve_advances(10, 1) == 45     # one slot: l(l-1)/2


def test_heterogeneous_costs_and_sizes():
    n, costs, sizes = 8, [1, 5, 1, 1, 5, 1, 1, 1], [1, 2, 1, 1, 3, 1, 1, 1, 1]
    dp = solve_chain(n, costs=costs, sizes=sizes)
    full = sum(sizes)
    assert dp.forwards(full) == sum(costs)                    # store all: no recompute
    for m in range(dp.min_budget, full + 1):
        s = dp.schedule(m)
        cost = sum(costs[i - 1] for op, i in s.actions if op == "fwd")
        assert s.peak_units(sizes) <= m and math.isclose(cost, dp.forwards(m))


def test_bad_input_errors():
    for k in (0, -1, 65, 2.5):
        with pytest.raises(MlsysError, match="1 <= k <= n=64"):
            every_k(64, k)
    with pytest.raises(MlsysError, match="minimum feasible 3"):
        optimal_chain(64, 2)
    with pytest.raises(MlsysError, match="positive int"):
        store_all(0)
    with pytest.raises(MlsysError, match="sizes"):
        solve_chain(3, sizes=[1, 1])
    with pytest.raises(MlsysError, match="GB of DP tables"):
        solve_chain(1000)
