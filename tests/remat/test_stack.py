"""Chain schedules on a user's layer stack: a list of different layers, or one layer scanned."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat import every_k, optimal_chain, sqrt_n, store_all
from mlsys_jax.remat.chain.stack import chain

WIDTHS = (16, 32, 32, 16, 16, 32, 16)          # a list of 6 layers of different shapes


def _layers():
    rng = np.random.default_rng(0)
    params = [{"w": jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a)), "b": jnp.zeros(b)}
              for a, b in zip(WIDTHS[:-1], WIDTHS[1:])]
    fns = [(lambda p, h: jnp.tanh(h @ p["w"] + p["b"])) if i % 2 else
           (lambda p, h: jax.nn.gelu(h @ p["w"]) + p["b"]) for i in range(len(params))]
    return fns, params, jnp.asarray(rng.standard_normal((256, WIDTHS[0])))


def _compiled(run, params, h):
    loss = lambda p, h: jnp.sum(run(p, h) ** 2)
    exe = jax.jit(jax.grad(loss)).lower(params, h).compile()
    return exe.memory_analysis().temp_size_in_bytes, exe(params, h)


@pytest.fixture(scope="module")
def stored():
    fns, params, h = _layers()
    return _compiled(chain(store_all(6), fns), params, h)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", [every_k(6, 2), every_k(6, 3), optimal_chain(6, 4)],
                         ids=lambda s: s.name)
def test_a_list_of_layers_recomputes_and_saves_memory(stored, schedule):
    fns, params, h = _layers()
    temp, grads = _compiled(chain(schedule, fns), params, h)
    assert temp < stored[0]
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(stored[1])):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_plain_checkpoints_on_a_list_are_merged_back_by_xla(stored):
    # the measured fact the pinned segments exist for: XLA:CPU drops jax.checkpoint's barrier
    # before CSE, so unrolled checkpointed segments save nothing (here they cost more)
    fns, params, h = _layers()

    def run(ps, h):
        for k in (0, 2, 4):
            seg = jax.checkpoint(lambda p, h, k=k: fns[k + 1](p[1], fns[k](p[0], h)))
            h = seg(ps[k:k + 2], h)
        return h
    assert _compiled(run, params, h)[0] >= stored[0]


@pytest.mark.slow
def test_a_scanned_layer_over_stacked_pytrees():
    rng = np.random.default_rng(1)
    stacked = {"w": jnp.asarray(rng.standard_normal((16, 16, 16)) / 4), "b": jnp.zeros((16, 16))}
    layer = lambda p, h: jnp.tanh(h @ p["w"] + p["b"])
    h = jnp.asarray(rng.standard_normal((256, 16)))
    base_temp, base = _compiled(chain(store_all(16), layer), stacked, h)
    for s in (sqrt_n(16), optimal_chain(16, 7)):
        temp, grads = _compiled(chain(s, layer), stacked, h)
        assert temp < base_temp, s.name
        for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(base)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_bad_stacks_are_named():
    fns, params, h = _layers()
    with pytest.raises(MlsysError, match="schedule is for 4 layers but 6"):
        chain(every_k(4, 2), fns)
    with pytest.raises(MlsysError, match="list of 6 parameter pytrees"):
        chain(every_k(6, 2), fns)(params[:5], h)
    with pytest.raises(MlsysError, match="leading axes \\[5\\]"):
        chain(every_k(6, 2), fns[0])({"w": jnp.ones((5, 16, 16))}, h)
    with pytest.raises(MlsysError, match="expected a Schedule"):
        chain((2, 2), fns)
