"""The example factories in examples/ build as their libraries intend, in float32.

Each factory is called under ``init_bits`` (``build``; why: tests/ecosystem/init_bits.py), and
nothing below depends on the drawn values. What the tests judge (the forward pass with its
dropout, the gradients, the loss, the optimizer's state) is traced and compiled outside it, with
JAX's defaults."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tests.ecosystem.init_bits import init_bits

import equinox_mlp
import flax_mlp
import flax_transformer

MODULES = [flax_mlp, equinox_mlp, flax_transformer]


def _float_leaves(tree):
    return [x for x in jax.tree_util.tree_leaves(tree) if eqx.is_inexact_array(x)]


def build(factory):
    """``factory()``, its random draws lowered the non-partitionable way (module docstring)."""
    with init_bits():
        return factory()


def _finite(tree) -> bool:
    """Every float leaf finite, read on the host: an eager ``jnp`` check would compile a program
    per leaf shape, more than the model's own."""
    return all(np.isfinite(np.asarray(x)).all() for x in _float_leaves(tree))


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_factories_run_in_float32(module):
    f, args = build(module.inspect)
    assert eqx.filter_jit(f)(*args).dtype == jnp.float32  # jitted: one compile, not one per op
    loss_fn, params, batch = build(module.loss)
    assert all(x.dtype == jnp.float32 for x in _float_leaves(params))
    grads = eqx.filter_jit(eqx.filter_grad(loss_fn))(params, batch)
    assert _finite(grads)
    loss_fn, params, batch, optimizer = build(module.train)
    state = jax.jit(optimizer.init)(eqx.filter(params, eqx.is_array))  # one compile, not per op
    assert _finite(eqx.filter_jit(loss_fn)(params, batch)) and state is not None


# The inspect-only factories (flax_resnet, nnx_resnet, equinox_cnn, stax_cnn) run jitted in
# float32 in tests/ecosystem/test_rewrites.py::test_inspect_only_factories_run_jitted_in_float32,
# where each is built once for its rewrites too (their builds are the cost).


def test_llama_factories_count_their_parameters_and_the_8b_one_allocates_nothing():
    import flax_llama as L

    _, params, _ = build(L.loss_tiny)  # its loss runs in tests/ecosystem/test_shapes.py
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == L.parameter_count(L.TINY)
    _, params, batch, _ = L.train_8b()  # shapes only: a real 8B init would need 32 GB
    leaves = jax.tree_util.tree_leaves((params, batch))
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    assert sum(x.size for x in jax.tree_util.tree_leaves(params)) == L.parameter_count(L.LLAMA_8B)
    assert L.parameter_count(L.LLAMA_8B) == 8_030_261_248  # Llama-3-8B's published size


def test_equinox_gpt_factories_count_their_parameters_and_the_1b_one_allocates_nothing():
    import equinox_gpt as G

    loss_fn, model, batch = build(G.loss_tiny)
    assert sum(x.size for x in _float_leaves(model)) == G.parameter_count(G.TINY)
    assert _finite(eqx.filter_jit(loss_fn)(model, batch))
    _, model, batch, _ = G.train_1b()
    arrays = [x for x in jax.tree_util.tree_leaves((model, batch)) if hasattr(x, "dtype")]
    assert arrays and all(isinstance(x, jax.ShapeDtypeStruct) for x in arrays)
    assert sum(x.size for x in arrays[:-2]) == G.parameter_count(G.GPT_1B) > 1_000_000_000
