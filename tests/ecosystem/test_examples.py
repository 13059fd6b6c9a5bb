"""The example factories in examples/ build as their libraries intend, in float32."""
import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import equinox_mlp
import flax_mlp
import flax_transformer

MODULES = [flax_mlp, equinox_mlp, flax_transformer]


def _float_leaves(tree):
    return [x for x in jax.tree_util.tree_leaves(tree) if eqx.is_inexact_array(x)]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_factories_run_in_float32(module):
    f, args = module.inspect()
    assert eqx.filter_jit(f)(*args).dtype == jnp.float32  # jitted: one compile, not one per op
    loss_fn, params, batch = module.loss()
    assert all(x.dtype == jnp.float32 for x in _float_leaves(params))
    grads = eqx.filter_jit(eqx.filter_grad(loss_fn))(params, batch)
    assert all(bool(jnp.isfinite(g).all()) for g in _float_leaves(grads))
    loss_fn, params, batch, optimizer = module.train()
    state = optimizer.init(eqx.filter(params, eqx.is_array))
    assert jnp.isfinite(eqx.filter_jit(loss_fn)(params, batch)) and state is not None


@pytest.mark.parametrize("name", ["flax_resnet", "nnx_resnet", "equinox_cnn", "stax_cnn"])
def test_inspect_only_factories_run_jitted_in_float32(name):
    module = __import__(name)
    f, args = module.inspect()
    out = eqx.filter_jit(f)(*args)  # equinox modules hold static (non-array) leaves
    assert out.dtype == jnp.float32 and bool(jnp.isfinite(out).all())


def test_llama_factories_count_their_parameters_and_the_8b_one_allocates_nothing():
    import flax_llama as L

    _, params, _ = L.loss_tiny()  # its loss runs in tests/ecosystem/test_shapes.py
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == L.parameter_count(L.TINY)
    _, params, batch, _ = L.train_8b()  # shapes only: a real 8B init would need 32 GB
    leaves = jax.tree_util.tree_leaves((params, batch))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == L.parameter_count(L.LLAMA_8B)
    assert L.parameter_count(L.LLAMA_8B) == 8_030_261_248  # Llama-3-8B's published size


def test_equinox_gpt_factories_count_their_parameters_and_the_1b_one_allocates_nothing():
    import equinox_gpt as G

    loss_fn, model, batch = G.loss_tiny()
    assert sum(x.size for x in _float_leaves(model)) == G.parameter_count(G.TINY)
    assert bool(jnp.isfinite(eqx.filter_jit(loss_fn)(model, batch)))
    _, model, batch, _ = G.train_1b()
    arrays = [x for x in jax.tree_util.tree_leaves((model, batch)) if hasattr(x, "dtype")]
    assert arrays and all(isinstance(x, jax.ShapeDtypeStruct) for x in arrays)
    assert sum(x.size for x in arrays[:-2]) == G.parameter_count(G.GPT_1B) > 1_000_000_000
