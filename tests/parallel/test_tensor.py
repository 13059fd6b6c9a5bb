"""Tensor parallelism: each split equals the unsplit math, with the collectives §5.2 predicts."""
import jax
import numpy as np
import optax
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import comm, make_mesh

from mlsys_jax.parallel.lecture import data, tensor
TOL = 1e-12


@pytest.fixture(scope="module")
def setup():
    mesh = make_mesh({"tensor": 4})
    p = tensor.mlp_init(7, 8, 12, np.float64)
    x = np.random.default_rng(0).standard_normal((8, 8))
    return mesh, p, x, tensor.mlp_reference(p, x)


def _run(fn, *args):
    out, compiled = comm.compile_and_run(fn, *args)
    return out, dict(comm.collective_counts(compiled.as_text()))


def test_column_and_row_splits(setup):
    mesh, p, x, _ = setup
    out, counts = _run(jax.jit(tensor.column_parallel(mesh)), x, p["w1"])
    assert np.max(np.abs(out - x @ p["w1"])) < TOL and counts == {"all-gather": 1}
    out, counts = _run(jax.jit(tensor.row_parallel(mesh)), x, p["w1"])
    assert np.max(np.abs(out - x @ p["w1"])) < TOL and counts == {"all-reduce": 1}


def test_megatron_mlp_needs_one_all_reduce_forward_and_one_backward(setup):
    mesh, p, x, want = setup
    sharded = tensor.shard_mlp_params(p, mesh)
    fwd = jax.jit(tensor.megatron_mlp(mesh))
    out, counts = _run(fwd, sharded, x)
    assert np.max(np.abs(out - want)) < TOL and counts == {"all-reduce": 1}
    # gradient w.r.t. params and input: Megatron's g (forward) and f (backward) all-reduces
    grad = jax.jit(jax.grad(lambda q, v: (tensor.megatron_mlp(mesh)(q, v) ** 2).sum(), (0, 1)))
    _, counts = _run(grad, sharded, x)
    assert counts == {"all-reduce": 2}


def test_sequence_parallel_splits_the_all_reduce_in_two(setup):
    mesh, p, x, want = setup
    out, counts = _run(jax.jit(tensor.sequence_parallel_mlp(mesh)), p, x)
    assert np.max(np.abs(out - want)) < TOL
    assert counts == {"all-gather": 1, "reduce-scatter": 1}


def test_wrong_split_is_wrong(setup):
    mesh, p, x, want = setup
    out, _ = _run(jax.jit(tensor.wrong_split_mlp(mesh)), p, x)
    assert np.max(np.abs(out - want)) > 0.1                        # §5.2: relu before the sum


@pytest.mark.slow
def test_tp_step_equals_single_device(setup):
    mesh, p, x, _ = setup
    opt = optax.adam(0.05)
    state = opt.init(p)
    t = np.random.default_rng(1).standard_normal(x.shape)
    got = tensor.make_tp_step(opt, mesh)(tensor.shard_mlp_params(p, mesh), state, x, t)
    ref = data.make_single_step(tensor.reference_loss, opt)(p, state, x, t)
    assert abs(float(got[2] - ref[2])) < TOL
    for a, b in zip((got[0], got[3], got[1]), (ref[0], ref[3], ref[1])):
        assert data.max_abs_diff(a, b) < TOL


def test_bad_layouts(setup):
    mesh, p, x, _ = setup
    with pytest.raises(MlsysError, match="hidden size over axis 'tensor': 6 is not divisible by"):
        tensor.shard_mlp_params(tensor.mlp_init(0, 4, 6), mesh)
    with pytest.raises(MlsysError, match="'model' is not in the mesh"):
        tensor.megatron_mlp(mesh, axis="model")
    with pytest.raises(MlsysError, match="tokens over axis 'tensor': 6 is not divisible by the axis size 4"):
        tensor.sequence_parallel_mlp(mesh)(p, x[:6])
    with pytest.raises(MlsysError, match="rows of w over axis 'tensor': 6 is not divisible"):
        tensor.row_parallel(mesh)(x[:, :6], p["w1"][:6])
