"""Megatron splits found inside a scan over stacked layers (flax ``nn.scan``, ``lax.scan``): each
trip's slice of a stacked weight is that weight less its layer axis, a pair inside the body is
split along the stacked weight's own dims, its all-reduces count once per trip; features carried
out of a trip (a recurrent cell) stay whole."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from mlsys_jax.parallel.shard import tensor_split

L, D, H = 3, 8, 16


def _derive(loss, params, x, m=2):
    closed = jax.make_jaxpr(loss)(params, x)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return tensor_split.derive(closed, dict(zip(closed.jaxpr.invars[:len(paths)], paths)), m)


def mlp_stack(params, x):
    def layer(h, w):
        return h + jax.nn.gelu(h @ w["w1"]) @ w["w2"], None
    h, _ = jax.lax.scan(layer, x, params)
    return jnp.mean(h ** 2)


def rnn(params, xs):
    def cell(h, x):
        return jnp.tanh(h @ params["w"] + x), None
    h, _ = jax.lax.scan(cell, jnp.zeros((xs.shape[1], H)), xs)
    return jnp.mean(h @ params["head"])


def test_a_stacked_mlp_pair_is_split_inside_the_scan():
    params = {"w1": jnp.ones((L, D, H)), "w2": jnp.ones((L, H, D))}
    found = _derive(mlp_stack, params, jnp.ones((4, D)))
    assert found.specs == {"['w1']": P(None, None, "model"), "['w2']": P(None, "model", None)}
    assert found.row_matmuls == L            # one forward all-reduce per layer
    assert not found.replicated


def test_features_carried_to_the_next_trip_stay_whole():
    params = {"w": jnp.ones((H, H)), "head": jnp.ones((H, 2))}
    found = _derive(rnn, params, jnp.ones((5, 4, H)))
    assert not found.specs
    assert "carried" in found.replicated["['w']"]
