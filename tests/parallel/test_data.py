"""Data parallelism: the DP step equals the single-device step; the traps are caught (§5.1)."""
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

from mlsys_jax.errors import MlsysError
from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import make_mesh
from mlsys_jax.parallel.lecture import data
TOL = 1e-12


@pytest.fixture(scope="module")
def setup():
    mesh = make_mesh({"data": 4})
    params, x, y = data.demo_problem(seed=3, batch=32, sizes=(6, 8, 3))
    opt = optax.adam(0.1)
    state = opt.init(params)
    ref = data.make_single_step(mlp_loss, opt)(params, state, x, y)
    return mesh, params, x, y, opt, state, ref


def _assert_equal_step(got, ref):
    assert abs(float(got[2] - ref[2])) < TOL                      # loss
    assert data.max_abs_diff(got[3], ref[3]) < TOL                # gradients
    assert data.max_abs_diff(got[0], ref[0]) < TOL                # updated params
    assert data.max_abs_diff(got[1], ref[1]) < TOL                # optimizer state


@pytest.mark.slow
def test_dp_step_equals_single_device_even_and_uneven(setup):
    mesh, params, x, y, opt, state, ref = setup
    step = data.make_dp_step(mlp_loss, opt, mesh)
    for counts in [(8, 8, 8, 8), (10, 10, 10, 2), (0, 11, 11, 10)]:
        got = step(params, state, *data.pad_shards(x, y, counts, width=11))
        _assert_equal_step(got, ref)
    assert data.max_abs_diff(ref[0], params) > 1e-3               # the step did move the params


def test_mean_of_means_is_wrong_for_uneven_shards_only(setup):
    mesh, params, x, y, opt, state, ref = setup
    naive = data.dp_grads_fn(mlp_loss, mesh, reduction="mean_of_means")
    loss, grads = naive(params, *data.pad_shards(x, y, (8, 8, 8, 8), width=10))
    assert data.max_abs_diff(grads, ref[3]) < TOL                 # equal shards: fine
    loss, grads = naive(params, *data.pad_shards(x, y, (10, 10, 10, 2)))
    assert data.max_abs_diff(grads, ref[3]) > 0.01                # §5.1: wrong (lecture 0.17)


def test_psum_of_an_already_summed_gradient_is_n_times_too_big(setup):
    mesh, params, x, y, opt, state, ref = setup
    loss, grads = data.dp_grads_fn(mlp_loss, mesh, reduction="double_psum")(
        params, *data.pad_shards(x, y, (8, 8, 8, 8)))
    g, r = data.flatten(grads), data.flatten(ref[3])
    np.testing.assert_allclose(g, 4 * r, rtol=1e-12, atol=1e-15)


def test_bad_inputs(setup):
    mesh, params, x, y, opt, state, ref = setup
    step = data.make_dp_step(mlp_loss, opt, mesh)
    with pytest.raises(MlsysError, match="30 is not divisible by the axis size 4"):
        step(params, state, x[:30], y[:30])
    with pytest.raises(MlsysError, match="not in the mesh"):
        data.make_dp_step(mlp_loss, opt, mesh, axis="batch")
    with pytest.raises(MlsysError, match="reduction"):
        data.dp_grads_fn(mlp_loss, mesh, reduction="sum")
    with pytest.raises(MlsysError, match="sum to the batch size"):
        data.pad_shards(x, y, (10, 10, 10, 10))
    with pytest.raises(MlsysError, match="smaller than the largest shard"):
        data.pad_shards(x, y, (10, 10, 10, 2), width=8)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=5).filter(lambda c: sum(c) > 0))
def test_pad_shards_keeps_every_sample_once_and_masks_the_rest(counts):
    n = sum(counts)
    x = np.arange(n, dtype=np.float64)[:, None] + 1.0
    y = np.arange(n)[:, None]
    xp, yp, mask = data.pad_shards(x, y, counts)
    assert len(xp) == len(counts) * max(counts) == len(mask)
    np.testing.assert_array_equal(xp[mask > 0, 0], x[:, 0])       # order kept, nothing lost
    assert np.all(xp[mask == 0] == 0)
    assert data.even_counts(n, len(counts))[0] == -(-n // len(counts))
    assert sum(data.even_counts(n, len(counts))) == n
