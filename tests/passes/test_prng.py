"""PRNG keys and RNG primitives: they trace, cost their key data's bytes, and pass through every
registered pass untouched — never folded, merged or removed while used."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import cost, ir, passes as P
from mlsys_jax.ir.primitives import RNG_BITS, RNG_KEYS
from mlsys_jax.passes import registry

CONST_KEY = jax.random.key(7)  # closed over: a constant of the jaxpr, like a dropout key


def dropout_twice(key, x):
    """Two dropouts with the same key (equal masks, a CSE temptation) and one with a constant
    key (a folding temptation), as training code with rngs looks."""
    a = jnp.where(jax.random.bernoulli(key, 0.5, x.shape), x, 0.0)
    b = jnp.where(jax.random.bernoulli(key, 0.5, x.shape), x, 0.0)
    c = x * jax.random.normal(CONST_KEY, x.shape, x.dtype)
    k1, _ = jax.random.split(jax.random.fold_in(key, 3))
    return a + b + c, jax.random.key_data(k1)


@pytest.fixture(scope="module")
def closed():
    return ir.trace(dropout_twice, jax.random.key(0), jax.ShapeDtypeStruct((4, 8), jnp.float32))


def _rng_counts(closed):
    counts = ir.primitive_counts(closed)
    return {p: n for p, n in counts.items() if p in RNG_KEYS | RNG_BITS}


@pytest.mark.slow
@pytest.mark.parametrize("name", registry.NAMES)
def test_every_pass_leaves_random_state_alone(closed, name):
    res = P.run(registry.make(name), closed, verify=True, cost=False)
    assert _rng_counts(res.jaxpr) == _rng_counts(closed)  # both dropouts kept, nothing folded
    args = [jax.random.key(1), jnp.asarray(np.random.default_rng(0).standard_normal((4, 8)),
                                             jnp.float32)]
    for want, got in zip(ir.interpret(closed, *args), ir.interpret(res.jaxpr, *args)):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))


def test_keys_cost_and_trace_without_numpy_dtypes(closed):
    r = cost.estimate(closed, strict=True)
    assert r.total_flops > 0 and r.unknown == []
    key_inputs = [v for v in closed.jaxpr.invars if "key" in str(v.aval.dtype)]
    assert len(key_inputs) == 1 and ir.aval_bytes(key_inputs[0].aval) == 8
    split = [k for k in r.kernels if k.name == "random_split"]
    assert split[0].dtype == "key<fry>" and split[0].bytes == 8 + 2 * 8  # one key in, two out
    keys = ir.random_inputs([jax.ShapeDtypeStruct((3,), jax.random.key(0).dtype)])[0]
    assert keys.shape == (3,) and len(set(map(int, jax.random.key_data(keys)[:, 1]))) == 3
