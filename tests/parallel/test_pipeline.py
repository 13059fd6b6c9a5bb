"""Pipeline schedules as data, their shard_map executor, and the 3D step (lecture §5.3–5.4)."""
from fractions import Fraction

import jax
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from experiments.s04_parallel.pipeline import LECTURE_TIMELINE, pipeline_checks, pipeline_section
from experiments.s04_parallel.threed import threed_checks, threed_section
from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.schedules import (BACKWARD, BACKWARD_LOSS, FORWARD, IDLE, Action,
                                         PipelineSchedule, bubble_formula, gpipe, make_schedule,
                                         min_microbatches, one_f_one_b)
from mlsys_jax.parallel.lecture.pipeline import (action_arrays, buffer_rows, mse_loss,
                                             pipeline_value_and_grad, sequential_value_and_grad,
                                             tanh_chain_init, tanh_chain_stage)

TOL = 1e-12


# --- schedules as data -------------------------------------------------------------------------

def test_gpipe_timeline_is_the_lectures():
    assert tuple(gpipe(2, 4).timeline().splitlines()) == LECTURE_TIMELINE


def test_one_f_one_b_timeline_alternates_after_warmup():
    assert one_f_one_b(2, 4).timeline().splitlines() == [
        "GPU1 | F1 F2  . B1 F3 B2 F4 B3  . B4",
        "GPU2 |  . F1 B1 F2 B2 F3 B3 F4 B4  ."]


@settings(max_examples=60, deadline=None)
@given(stages=st.integers(1, 6), microbatches=st.integers(1, 12),
       name=st.sampled_from(["gpipe", "1f1b"]))
def test_schedule_properties(stages, microbatches, name):
    sched = make_schedule(name, stages, microbatches)
    sched.check_dependencies()  # every F and B once, each after its inputs
    assert sched.steps == 2 * (microbatches + stages - 1)
    assert sched.bubble_fraction() == bubble_formula(stages, microbatches)
    peaks = sched.in_flight_peaks()
    if name == "gpipe":
        assert peaks == (microbatches,) * stages
    else:
        assert peaks == tuple(min(stages - s, microbatches) for s in range(stages))


def test_lecture_bubbles_and_in_flight():
    assert gpipe(2, 1).bubble_fraction() == Fraction(1, 2)
    assert gpipe(2, 4).bubble_fraction() == Fraction(1, 5)
    assert round(float(gpipe(2, 64).bubble_fraction()), 3) == 0.015
    assert gpipe(4, 8).in_flight_peaks() == (8, 8, 8, 8)
    assert one_f_one_b(4, 8).in_flight_peaks() == (4, 3, 2, 1)
    assert one_f_one_b(4, 8).bubble_fraction() == Fraction(3, 11)


def test_exercise_6_smallest_microbatches():
    # 3/(27+3) is exactly 10%, not below it: the float 0.1 must not let M = 27 through.
    assert min_microbatches(4, 0.1) == 28
    assert min_microbatches(4, 0.1, "1f1b") == 28
    assert min_microbatches(4, Fraction(1, 10)) == 28
    assert min_microbatches(1, 0.5) == 1
    with pytest.raises(MlsysError, match="max_bubble"):
        min_microbatches(4, 0.0)


@pytest.mark.parametrize("call, match", [
    (lambda: gpipe(0, 4), "stages must be an integer >= 1"),
    (lambda: one_f_one_b(2, 0), "microbatches must be an integer >= 1"),
    (lambda: gpipe(2, True), "microbatches"),
    (lambda: gpipe(4, 8, layers=2), "4 stages but only 2 layers"),
    (lambda: make_schedule("zigzag", 2, 2), "unknown schedule 'zigzag'"),
    (lambda: bubble_formula(2, -1), "microbatches"),
])
def test_bad_counts_get_clear_errors(call, match):
    with pytest.raises(MlsysError, match=match):
        call()


def test_check_dependencies_catches_a_broken_table():
    good = gpipe(2, 2)
    rows = [list(r) for r in good.table]
    rows[0][1], rows[1][1] = Action("F", 0), None  # stage 2 runs F1 before stage 1 sent it
    with pytest.raises(MlsysError, match="before its input"):
        PipelineSchedule("broken", 2, 2, tuple(map(tuple, rows))).check_dependencies()
    with pytest.raises(MlsysError, match="actions, expected"):
        PipelineSchedule("short", 2, 2, good.table[:-1]).check_dependencies()


def test_buffer_rows_follow_in_flight_peaks():
    assert buffer_rows(action_arrays(gpipe(4, 8))) == 8
    assert buffer_rows(action_arrays(one_f_one_b(4, 8))) == 4
    assert buffer_rows(action_arrays(one_f_one_b(2, 64))) == 2


def test_action_arrays_route_messages_to_neighbours():
    sched = gpipe(2, 4)
    arr = action_arrays(sched)
    assert arr["op"][:, 0].tolist() == [FORWARD] * 4 + [IDLE] * 2 + [BACKWARD] * 4
    assert arr["op"][:, 1].tolist() == [IDLE] + [FORWARD] * 4 + [BACKWARD_LOSS] * 4 + [IDLE]
    # stage 1's F_i at step i arrives at stage 2 after that step; stage 2's B_i goes back.
    assert arr["recv_act"][:4, 1].tolist() == [1, 2, 3, 4] and not arr["recv_act"][:, 0].any()
    assert arr["recv_grad"][5:9, 0].tolist() == [4, 3, 2, 1] and not arr["recv_grad"][:, 1].any()


# --- the executor ------------------------------------------------------------------------------

def _chain(stages, microbatches, layers):
    rng = np.random.default_rng(0)
    params = tanh_chain_init(rng, layers, 8, stages, np.float64)
    x, y = rng.standard_normal((2, 2 * microbatches, 8))
    return params, x, y


@pytest.mark.slow
@pytest.mark.parametrize("stages, microbatches", [(2, 4), (4, 3)])
def test_executor_equals_single_device(stages, microbatches):
    params, x, y = _chain(stages, microbatches, 2 * stages)
    ref_loss, ref_grads = jax.jit(sequential_value_and_grad, static_argnums=(0, 1))(
        tanh_chain_stage, mse_loss, params, x, y)
    mesh = make_mesh({"pipe": stages})
    for name in ("gpipe", "1f1b"):
        sched = make_schedule(name, stages, microbatches)
        got = pipeline_value_and_grad(sched, tanh_chain_stage, mse_loss, params, x, y, mesh)
        assert abs(float(got.loss) - float(ref_loss)) < TOL
        for g, r in zip(jax.tree.leaves(got.grads), jax.tree.leaves(ref_grads)):
            assert g.shape == r.shape and np.max(np.abs(np.asarray(g) - np.asarray(r))) < TOL
        idle = [sum(row[s] is None for row in sched.table) for s in range(stages)]
        assert np.asarray(got.idle_steps).tolist() == idle
        assert got.buffer_rows == (microbatches if name == "gpipe"
                                   else min(stages, microbatches))


def test_executor_bad_input():
    params, x, y = _chain(2, 4, 4)
    sched = gpipe(2, 4)
    with pytest.raises(MlsysError, match="mesh axis 'pipe' has 4 devices"):
        pipeline_value_and_grad(sched, tanh_chain_stage, mse_loss, params, x, y,
                                make_mesh({"pipe": 4}))
    mesh = make_mesh({"pipe": 2})
    with pytest.raises(MlsysError, match="equal microbatches"):
        pipeline_value_and_grad(sched, tanh_chain_stage, mse_loss, params, x[:7], y[:7], mesh)
    with pytest.raises(MlsysError, match="leading axis of 2"):
        pipeline_value_and_grad(sched, tanh_chain_stage, mse_loss,
                                {k: v[:1] for k, v in params.items()}, x, y, mesh)
    with pytest.raises(MlsysError, match="axis 'stages' is not in the mesh"):
        pipeline_value_and_grad(sched, tanh_chain_stage, mse_loss, params, x, y, mesh,
                                axis="stages")
    with pytest.raises(MlsysError, match="4 stages but only 2 layers"):
        tanh_chain_init(np.random.default_rng(0), 2, 8, 4, np.float64)
    with pytest.raises(MlsysError, match="do not split evenly"):
        tanh_chain_init(np.random.default_rng(0), 5, 8, 2, np.float64)


# --- 3D and the experiment sections ------------------------------------------------------------

@pytest.mark.slow
def test_threed_step_equals_single_device():
    tables = threed_section()
    checks = threed_checks(tables)
    row, = tables["3D step vs single device"]
    assert max(row["loss_diff"], row["grad_diff"], row["param_diff"]) < TOL
    assert row["param_change"] > 1e-3  # the step really moved the parameters
    assert all(c.ok for c in checks)


def test_threed_bad_input():
    from mlsys_jax.parallel.lecture.threed import make_3d_step
    import optax

    mesh = make_mesh({"data": 2, "model": 2, "pipe": 2})
    with pytest.raises(MlsysError, match="not divisible by the axis size 2"):
        make_3d_step(mesh, optax.sgd(0.1), microbatches=2, batch=15)
    with pytest.raises(MlsysError, match="microbatches"):
        make_3d_step(mesh, optax.sgd(0.1), microbatches=3, batch=16)
    with pytest.raises(MlsysError, match="axis 'model' is not in the mesh"):
        make_3d_step(make_mesh({"data": 2, "pipe": 2}), optax.sgd(0.1), 2, 16)


def test_threed_section_skips_when_devices_do_not_fit():
    tables = threed_section(devices=jax.devices()[:4])
    checks = threed_checks(tables)
    assert "needs 8 devices, 4 available" in tables["3D step vs single device"][0]["note"]
    assert len(checks) == 1 and checks[0].ok


@pytest.mark.slow
def test_pipeline_section_defaults_pass_every_check():
    tables = pipeline_section()
    checks = pipeline_checks(tables, (2, 4))
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    bubbles = {(r["P"], r["M"], r["schedule"]): r["bubble"] for r in tables["pipeline bubble"]}
    assert bubbles[(2, 1, "gpipe")] == 0.5 and bubbles[(2, 4, "1f1b")] == 0.2


def test_pipeline_section_overrides_and_skips():
    tables = pipeline_section(pp_stages=3, microbatches=5, devices=2)
    checks = pipeline_checks(tables, (3, 5))
    assert all(c.ok for c in checks)
    bubble_rows = [r for r in tables["pipeline bubble"] if (r["P"], r["M"]) == (3, 5)]
    assert [r["bubble"] for r in bubble_rows] == [2 / 7, 2 / 7]
    assert "need 3 devices, 2 available" in tables["pipeline executor vs single device"][0]["note"]
    with pytest.raises(MlsysError, match="pp_stages"):
        pipeline_section(pp_stages=0)
    with pytest.raises(MlsysError, match="microbatches"):
        pipeline_section(microbatches=0)
