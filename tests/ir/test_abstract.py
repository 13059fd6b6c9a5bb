"""A factory run on shapes gives the structs of what it would build, and says where it needed a
value instead of failing inside JAX."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.abstract import is_abstract, run_abstract


def _factory():
    k1, k2 = jax.random.split(jax.random.key(0))
    params = {"w": jax.random.normal(k1, (16, 8), jnp.float32), "b": jnp.zeros(8, jnp.bfloat16)}
    batch = {"x": jax.random.normal(k2, (4, 16)), "y": jnp.arange(4)}
    loss = lambda p, b: jnp.mean((b["x"] @ p["w"] + p["b"]) ** 2)
    return loss, params, batch, optax.adam(1e-3)


def test_the_structs_are_those_of_the_concrete_factory_and_the_rest_is_kept():
    loss, params, batch, opt = run_abstract(_factory)
    concrete = _factory()
    assert is_abstract((params, batch)) and not is_abstract(concrete[1])
    same = jax.tree.map(lambda s, a: (s.shape, s.dtype) == (a.shape, a.dtype), (params, batch),
                        concrete[1:3])
    assert all(jax.tree.leaves(same))
    assert callable(loss) and isinstance(opt, optax.GradientTransformation)
    # the kept function works on the structs: its jaxpr is the concrete one's
    assert str(jax.make_jaxpr(loss)(params, batch)) == str(jax.make_jaxpr(loss)(*concrete[1:3]))


def test_a_factory_that_reads_a_value_is_named_at_its_line():
    def reads_a_value():
        w = jnp.ones((4, 4))
        scale = float(np.asarray(w).max())
        return (lambda x: x * scale), (jnp.ones(4),)

    with pytest.raises(MlsysError, match=r"test_abstract.py:\d+ .*jnp instead of NumPy"):
        run_abstract(reads_a_value)


def test_nothing_of_the_models_size_is_allocated():
    def huge():  # 64 GiB in float32: only shapes can hold it here
        return (lambda w: w.sum()), (jnp.zeros((1 << 17, 1 << 17), jnp.float32),)

    _, (w,) = run_abstract(huge)
    assert w.shape == (1 << 17, 1 << 17) and is_abstract(w)
