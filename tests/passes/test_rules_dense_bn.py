"""fold_dense_bn: an inference BatchNorm (any per-feature affine map with a shift) folded into the
Dense layer before it, on the layers users have — flax ``nn.Dense`` + ``nn.BatchNorm``, haiku
``hk.Linear`` + ``hk.BatchNorm``, equinox ``Linear`` + ``BatchNorm`` (vmapped, ``W @ x``): every
Dense/BN pair folded, every output element within 1e-5 on fresh inputs; training mode refused
with the reason; a bias along the rows refused or folded correctly."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import ir, passes as P
from mlsys_jax.passes import registry

X = jax.random.normal(jax.random.key(0), (8, 6), jnp.float32)
FRESH = [2.0 * jax.random.normal(jax.random.key(10 + k), X.shape, jnp.float32) for k in range(3)]


def _fold(closed):
    return P.run(P.chain(P.fold_constants(), registry.make("fold_dense_bn"), P.dce()), closed)


def _folds_every_pair(f, pairs: int):
    """Folded (every pair, no BN op left), and within 1e-5 per element on fresh inputs."""
    closed = ir.trace(f, X)
    res = _fold(closed)
    fired = [w for w in res.rewrites if w.rule == "fold_dense_bn"]
    assert len(fired) == pairs and "BatchNorm" in fired[0].detail, res.refusals
    counts = ir.primitive_counts(res.jaxpr)
    assert counts["dot_general"] == pairs and not counts["rsqrt"] and not counts["sqrt"]
    for x in FRESH:
        want = np.asarray(f(x))
        got = np.asarray(ir.interpret(res.jaxpr, x)[0])
        assert np.abs(want).max() > 0.1  # not a vacuous comparison
        assert np.abs(got - want).max() <= 1e-5


def _refused_as_training(f):
    res = P.run(registry.make("fold_dense_bn"), ir.trace(f, X))
    assert not any(w.rule == "fold_dense_bn" for w in res.rewrites)
    assert any("training mode" in r.reason for r in res.refusals), res.refusals


def _stats(v):
    """Non-trivial parameters and statistics, as after training."""
    leaves, tree = jax.tree_util.tree_flatten(v)
    keys = jax.random.split(jax.random.key(2), len(leaves))
    return jax.tree_util.tree_unflatten(tree, [a + 0.3 * jax.random.uniform(k, a.shape)
                                               for a, k in zip(leaves, keys)])


def test_a_plain_jax_dense_then_batch_norm_folds():
    rng = np.random.default_rng(0)
    w, b = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in ((6, 5), (5,)))
    gamma, beta, mean = (jnp.asarray(rng.standard_normal(5), jnp.float32) for _ in range(3))
    var = jnp.asarray(rng.uniform(0.5, 2.0, 5), jnp.float32)
    _folds_every_pair(lambda x: jax.nn.relu(((x @ w + b) - mean) * jax.lax.rsqrt(var + 1e-5)
                                            * gamma + beta), 1)


def test_a_bias_along_the_rows_is_not_taken_for_a_feature_bias():
    """Five outputs of five rows: a bias ``b[:, None]`` has the features' length but runs along
    the rows. Refused with the axis named, or folded correctly — never folded along features."""
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((6, 5)), jnp.float32)
    b, s, t = (jnp.asarray(rng.standard_normal(5), jnp.float32) for _ in range(3))
    x5 = X[:5]
    f = lambda x: (x @ w + b[:, None]) * s + t  # noqa: E731
    closed = ir.trace(f, x5)
    res = _fold(closed)
    for x in FRESH:
        np.testing.assert_allclose(ir.interpret(res.jaxpr, x[:5])[0], f(x[:5]), atol=1e-5)
    assert any(r.check == "per_feature_operand" and "axis 0" in r.reason for r in res.refusals)


@pytest.mark.slow
def test_flax_dense_and_batch_norm():
    import flax.linen as nn

    class MLP(nn.Module):
        train: bool = False

        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.BatchNorm(use_running_average=not self.train)(nn.Dense(5)(x)))
            return nn.BatchNorm(use_running_average=not self.train)(nn.Dense(3)(x))

    v = _stats(MLP().init(jax.random.key(1), X))
    _folds_every_pair(lambda x: MLP().apply(v, x), 2)
    _refused_as_training(lambda x: MLP(train=True).apply(v, x, mutable=["batch_stats"])[0])


@pytest.mark.slow
def test_haiku_linear_and_batch_norm():
    import haiku as hk

    def mlp(x, is_training=False):
        x = hk.BatchNorm(True, True, 0.9)(hk.Linear(5)(x), is_training=is_training)
        x = hk.BatchNorm(True, True, 0.9)(hk.Linear(3)(jax.nn.relu(x)), is_training=is_training)
        return x
    t = hk.transform_with_state(mlp)
    params, state = t.init(jax.random.key(1), X, is_training=True)
    _, state = t.apply(params, state, None, 3.0 * X + 1.0, is_training=True)  # running stats
    _folds_every_pair(lambda x: t.apply(params, state, None, x)[0], 2)
    _refused_as_training(lambda x: t.apply(params, state, None, x, is_training=True)[0])


@pytest.mark.slow
def test_equinox_linear_and_batch_norm():
    import equinox as eqx

    lin = eqx.nn.Linear(6, 5, key=jax.random.key(3))
    bn, state = eqx.nn.make_with_state(eqx.nn.BatchNorm)(5, "batch", momentum=0.5, mode="ema")
    bn = eqx.tree_at(lambda b: b.weight, bn, jnp.linspace(0.5, 2.0, 5))

    def apply(bn, state, x):
        return jax.vmap(lambda xi, s: bn(lin(xi), s), axis_name="batch",
                        in_axes=(0, None), out_axes=(0, None))(x, state)
    _, state = apply(bn, state, 3.0 * X + 1.0)  # training mode: running statistics
    _refused_as_training(lambda x: apply(bn, state, x)[0])
    frozen = eqx.nn.inference_mode(bn)
    _folds_every_pair(lambda x: apply(frozen, state, x)[0], 1)
