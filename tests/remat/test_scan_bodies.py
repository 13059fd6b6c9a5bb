"""A model whose layers are a scan: its plans checkpoint the scan body (planner.scan_bodies), the
one recomputation that frees a layer's activations; gradients equal jax.grad's, on arrays, and the
same plans are chosen by compiled bytes on shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.remat.planner.scan_bodies import (
    POLICIES, scans_to_checkpoint, with_bodies_checkpointed)
from mlsys_jax.remat.planner.shapes import plan_on_shapes

pytest.importorskip("scipy")
LAYERS, WIDTH, BATCH = 8, 32, 64


def _layer(h, w):
    a = jnp.tanh(h @ w["w1"])
    return h + jnp.sin(a @ w["w2"]), None


def scanned_loss(params, batch):
    h, _ = jax.lax.scan(_layer, batch["x"], params)
    return jnp.mean((h - batch["y"]) ** 2)


def checkpointed_loss(params, batch):
    h, _ = jax.lax.scan(jax.checkpoint(_layer), batch["x"], params)
    return jnp.mean((h - batch["y"]) ** 2)


def _inputs():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    params = {"w1": jax.random.normal(k1, (LAYERS, WIDTH, WIDTH)) / WIDTH ** 0.5,
              "w2": jax.random.normal(k2, (LAYERS, WIDTH, WIDTH)) / WIDTH ** 0.5}
    x = jax.random.normal(k3, (BATCH, WIDTH))
    return params, {"x": x, "y": jnp.roll(x, 1, axis=1)}


@pytest.mark.slow
def test_every_policy_gives_jax_grads_and_fewer_temp_bytes():
    params, batch = _inputs()
    ref = jax.grad(scanned_loss)(params, batch)
    temp = lambda f: jax.jit(jax.grad(f)).lower(params, batch).compile().memory_analysis() \
        .temp_size_in_bytes  # noqa: E731
    base = temp(scanned_loss)
    for policy in POLICIES:
        f = with_bodies_checkpointed(scanned_loss, policy)
        got = jax.grad(f)(params, batch)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ref)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    nothing = with_bodies_checkpointed(scanned_loss, "nothing_saveable")
    assert temp(nothing) < base


def test_a_body_the_user_checkpointed_is_left_alone():
    params, batch = _inputs()
    closed = jax.make_jaxpr(checkpointed_loss)(params, batch)
    assert scans_to_checkpoint(closed.jaxpr) == 0
    assert scans_to_checkpoint(jax.make_jaxpr(scanned_loss)(params, batch).jaxpr) == 1


@pytest.mark.slow
def test_the_planner_meets_a_budget_no_milp_plan_reaches_with_jax_grads():
    params, batch = _inputs()
    fr = Frontier(scanned_loss, params, batch, repeats=2, timing_budget_s=0.5)
    plan = fr.plan("60%")
    assert plan.scan_policy in POLICIES
    assert plan.compiled_temp_bytes <= 0.6 * fr.no_remat.compiled_temp_bytes
    assert fr.program(plan).grads_max_rel_diff < 1e-6


@pytest.mark.slow
def test_on_shapes_the_same_plan_is_chosen_by_compiled_bytes():
    params, batch = _inputs()
    spec = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), t)  # noqa
    out = plan_on_shapes(scanned_loss, spec(params), spec(batch), "60%", policies=False)
    assert out.plan.scan_policy in POLICIES
    assert out.plan.compiled_temp_bytes <= out.budget_bytes
    # recomputation costs FLOPs: the prediction (scan bodies per trip) says so
    assert out.predicted_step_time_ratio > 1.0
