"""ZeRO 1-3: the step equals plain DP, and memory_analysis() per-device bytes equal the formulas."""
import numpy as np
import optax
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import comm, make_mesh

from mlsys_jax.parallel.lecture import data, zero
TOL = 1e-12


@pytest.fixture(scope="module")
def setup():
    mesh = make_mesh({"data": 4})
    params, x, y = data.demo_problem(seed=5, batch=16, sizes=(5, 7, 3))   # Ψ = 66: padded to 68
    opt = optax.adam(0.1)
    state = opt.init(params)
    batch = data.pad_shards(x, y, data.even_counts(16, 4))
    ref = data.make_single_step(mlp_loss, opt)(params, state, x, y)
    return mesh, params, opt, batch, ref


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_step_equals_plain_dp_and_bytes_equal_formulas(setup, stage):
    mesh, params, opt, batch, ref = setup
    zs = zero.make_zero_step(mlp_loss, opt, params, mesh, stage)
    assert (zs.n_params, zs.padded) == (66, 68)
    flat, state = zs.init(params)
    xs, ys, ms = data.shard_batch(mesh, "data", *batch)
    out, compiled = comm.compile_and_run(zs.step, flat, state, xs, ys, ms)
    assert abs(float(out[2] - ref[2])) < TOL
    assert data.max_abs_diff(zs.unflatten(out[0]), ref[0]) < TOL
    grads = np.asarray(out[3])[:66]                              # sharded grads, gathered on host
    assert data.max_abs_diff(grads, data.flatten(ref[3])) < TOL
    measured = zero.measure(compiled)
    want = zero.expected_bytes(stage, zs.padded, 4, 8, state, comm.nbytes(batch), 8)
    assert (measured["arguments"], measured["outputs"]) == (want["arguments"], want["outputs"])
    shard = 68 // 4 * 8
    assert want["optimizer"] == 2 * shard                        # every stage shards Adam's m, v
    assert want["grads"] == (shard if stage >= 2 else 68 * 8)
    assert want["params"] == (shard if stage == 3 else 68 * 8)
    kinds = set(comm.collective_counts(compiled.as_text()))
    assert ("reduce-scatter" in kinds) == (stage >= 2)           # stage 2+: grads reduce-scattered


def test_model_state_shrinks_as_the_zero_paper_says():
    f = {s: sum(zero.per_device_bytes(s, 800, 8, 4).values()) for s in zero.STAGES}
    assert f == {0: 16 * 800, 1: 4 * 800 * 2 + 8 * 800 // 8, 2: 4 * 800 + 12 * 800 // 8,
                 3: 16 * 800 // 8}


def test_bad_stage_and_axis(setup):
    mesh, params, opt, batch, ref = setup
    with pytest.raises(MlsysError, match="stage must be one of"):
        zero.make_zero_step(mlp_loss, opt, params, mesh, 4)
    with pytest.raises(MlsysError, match="not in the mesh"):
        zero.make_zero_step(mlp_loss, opt, params, mesh, 1, axis="zero")
