"""A training step laid out and compiled on shapes: the bytes each device holds follow ZeRO's
table, XLA's figures equal those of the same step on arrays, and nothing is run."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlsys_jax.parallel.shard.shapes import compile_on_shapes


def _mlp(width=64, depth=3, rows=16):
    rng = np.random.default_rng(0)
    params = [{"w": rng.standard_normal((width, width)).astype(np.float32),
               "b": np.zeros(width, np.float32)} for _ in range(depth)]
    batch = {"x": rng.standard_normal((rows, width)).astype(np.float32),
             "y": rng.standard_normal((rows, width)).astype(np.float32)}

    def loss(p, b):
        h = b["x"]
        for layer in p:
            h = jnp.tanh(h @ layer["w"] + layer["b"])
        return jnp.mean((h - b["y"]) ** 2)
    return loss, params, batch


def _shapes(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


@pytest.mark.parametrize("zero", [0, 3])
def test_per_device_bytes_follow_the_stage_and_equal_the_step_on_arrays(zero):
    loss, params, batch = _mlp()
    n, psi = 8, sum(x.size for x in jax.tree.leaves(params))
    on_shapes = compile_on_shapes(loss, _shapes(params), _shapes(batch), optax.adam(1e-3),
                                  {"data": n}, zero=zero)
    on_arrays = compile_on_shapes(loss, params, batch, optax.adam(1e-3), {"data": n}, zero=zero)
    d = on_shapes.per_device
    assert d == on_arrays.per_device and on_shapes.collectives == on_arrays.collectives
    share = n if zero == 3 else 1
    assert d["param_bytes"] == 4 * psi // share
    assert d["grad_bytes"] == 4 * psi // (n if zero >= 2 else 1)
    assert d["optimizer_bytes"] - 4 == 8 * psi // (n if zero >= 1 else 1)  # + Adam's step count
    batch_bytes = sum(x.nbytes for x in jax.tree.leaves(batch)) // n
    assert d["xla_argument_bytes"] == d["param_bytes"] + d["optimizer_bytes"] + batch_bytes
    assert d["total_bytes"] == (d["xla_argument_bytes"] + d["xla_output_bytes"]
                                - d["xla_alias_bytes"] + d["xla_temp_bytes"])
    kinds = {r["kind"] for r in on_shapes.collectives if r["count"]}
    assert ("all-gather" in kinds) == (zero == 3) and "all-reduce" in kinds
    assert on_shapes.to_json()["executed"] is False and on_shapes.abstract
