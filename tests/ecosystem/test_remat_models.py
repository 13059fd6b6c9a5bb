"""Recomputation on users' models (flax MLP, flax transformer, flax nn.scan stack, equinox MLP),
judged on the compiled program: XLA's temp bytes, compiled FLOPs, gradients against jax.grad.
The models draw their parameters with threefry's other lowering (`init_bits.py` here: an init
compiles much sooner); their losses are traced and compiled with JAX's defaults."""
import equinox as eqx
import jax
import numpy as np
import pytest

import equinox_mlp
import flax_mlp
import flax_scan
import flax_transformer
from mlsys_jax import timing
from mlsys_jax.remat import Frontier, apply, every_k, measure, optimal_chain, store_all
from mlsys_jax.remat.milp import plan_key
from mlsys_jax.remat.planner.flat import flatten_loss
from mlsys_jax.remat.planner.measure import compile_grad, grad_difference
from mlsys_jax.remat.planner.policies import BUILTIN_POLICIES, versus_policies
from mlsys_jax.remat.planner.segments import problem
from tests.ecosystem.init_bits import init_bits

pytest.importorskip("scipy")

# a short ladder keeps the suite fast; it still reaches the minimum, 60% and each policy's bytes
LADDER = (0.0, 0.2, 0.45)


def transformer_loss():
    """flax_transformer's model at 2 layers over 16 tokens (the example's ``loss`` has 4 over 32):
    its 60% and least plans still recompute, at about half the compile time."""
    model, variables, batch = flax_transformer._setup(2, seq=16)
    return flax_transformer.loss_of(model), variables, batch


@pytest.fixture(scope="module")
def frontiers():
    with jax.enable_x64(False):
        with init_bits():                # the parameters' draws compile much sooner
            built = {"flax_mlp": flax_mlp.loss(), "flax_transformer": transformer_loss()}
        return {name: Frontier(*b, ladder=LADDER) for name, b in built.items()}


@pytest.fixture(params=["flax_mlp", "flax_transformer"])
def frontier(request, frontiers):
    return frontiers[request.param]


def _grads(fr, p):
    return fr.compiled[plan_key(p)](fr.flat.diff, fr.flat.batch)


def test_tighter_budgets_compile_to_fewer_temp_bytes_and_more_flops(frontier):
    full, sixty, least = (frontier.plan(b) for b in ("100%", "60%", frontier.min_budget_bytes))
    temps = [p.compiled_temp_bytes for p in (full, sixty, least)]
    assert temps == sorted(temps, reverse=True) and least.compiled_temp_bytes < temps[0]
    assert sixty.compiled_temp_bytes <= 0.6 * full.compiled_temp_bytes
    assert full.recomputed == () and full.compiled_flops == frontier.no_remat.compiled_flops
    for p in (sixty, least):               # values recomputed: the compiled FLOPs show it
        assert p.recomputed and p.compiled_flops > full.compiled_flops
    reference = _grads(frontier, full)
    for p in (sixty, least):
        assert grad_difference(_grads(frontier, p), reference)[1] < 1e-6


def test_policies_are_judged_on_bytes_and_measured_time(frontier):
    versus = versus_policies(frontier, repeats=3)
    assert [m["policy"] for m in versus["matched"]] == list(BUILTIN_POLICIES)
    times = frontier.last_times                                  # the session's Timings
    for m in versus["matched"]:
        assert m["plan_temp_bytes"] <= m["policy_temp_bytes"]
        ratio = timing.ratio(times[m["plan"]], times[m["policy"]])  # paired, per round
        assert m["not_dominated"] == (ratio.low <= 1), m          # slower in every round: no
    assert len(BUILTIN_POLICIES) == 5


def test_measure_and_apply_differentiate_the_parameters_only(frontiers):
    with init_bits():                    # the fixture's model again: its init compiled once
        loss_fn, params, batch = flax_mlp.loss()
    p = frontiers["flax_mlp"].plan("60%")
    m = measure(loss_fn, p, params, batch)                       # integer labels in the batch
    assert m["compiled_temp_bytes"] == p.compiled_temp_bytes
    assert m["grads_max_rel_diff"] < 1e-6
    applied = apply(loss_fn, p, params, batch)
    ours, ref = (jax.jit(jax.grad(f))(params, batch) for f in (applied, loss_fn))
    assert jax.tree_util.tree_structure(ours) == jax.tree_util.tree_structure(ref)
    leaves = jax.tree_util.tree_leaves
    assert grad_difference(leaves(ours), leaves(ref))[1] < 1e-6


def test_equinox_module_with_static_leaves():
    with init_bits():
        loss_fn, model, batch = equinox_mlp.loss()
    prob = problem(loss_fn, model, batch)
    raw = prob.solve(prob.min_peak_budget_bytes)                  # the MILP's plan, recomputing
    assert raw.recomputed
    applied = apply(loss_fn, raw, model, batch)
    ours, ref = (eqx.filter_jit(eqx.filter_grad(f))(model, batch) for f in (applied, loss_fn))
    leaves = lambda t: [x for x in jax.tree_util.tree_leaves(t) if eqx.is_array(x)]
    assert grad_difference(leaves(ours), leaves(ref))[1] < 1e-6


@pytest.fixture(scope="module")
def scan_stack():
    with jax.enable_x64(False):
        with init_bits():
            loss_fn, variables, batch = flax_scan.loss()
        flat = flatten_loss(loss_fn, variables, batch)
        exe, temp, flops = compile_grad(flat.fn, flat)
        return temp, flops, exe(flat.diff, flat.batch)


@pytest.mark.parametrize("schedule", [store_all(16), every_k(16, 4), optimal_chain(16, 6)],
                         ids=lambda s: s.name)
def test_chain_schedules_on_a_flax_scan_stack(scan_stack, schedule):
    model_temp, model_flops, reference = scan_stack
    with init_bits():                    # the fixture's model again: its init compiled once
        built = flax_scan.scheduled(schedule)
    flat = flatten_loss(*built)
    exe, temp, flops = compile_grad(flat.fn, flat)
    grads = exe(flat.diff, flat.batch)
    if schedule.name == "store-all":        # the nn.scan model itself, bit for bit
        assert temp == model_temp and all(np.array_equal(a, b) for a, b in zip(grads, reference))
    else:       # cost_analysis counts a loop body once: the rise is real but not ×trip count
        assert temp < model_temp and flops > model_flops
        assert grad_difference(grads, reference)[1] < 1e-6
