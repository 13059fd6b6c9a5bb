"""Graph-break capture on third-party models as their libraries ship them, with their state
changed in place between calls the way each library changes it (an nnx optimizer step, Keras's
``assign``, a params dict edited in place, an equinox module swapped for an updated one): every
call equals eager bitwise (``fuzz.capture_oracle.compare``), and the change is named by the guard
that caught it. A library's own bookkeeping (flax's module counter, Keras's ``_called`` on the
first call) is not mistaken for the user's side effect: warm calls replay.
"""
import os

import jax
import jax.numpy as jnp
import pytest

from mlsys_jax.execute import capture, explain
from mlsys_jax.fuzz.capture_oracle import compare

X = jnp.linspace(-1.0, 1.0, 16, dtype=jnp.float32).reshape(2, 8)


def check(fn, args, change):
    """Three calls, the change, three calls: all equal eager; returns (captured, explain)."""
    c = capture(fn)
    for step in (lambda: None, change):
        step()
        for _ in range(3):
            diff = compare(c(*args), fn(*args))
            assert diff is None, diff
    return c, explain(c, *args)


def _flax_linen():
    import flax.linen as nn

    class MLP(nn.Module):  # flax's examples' idiom: nn.compact, a branch on the data
        @nn.compact
        def __call__(self, x):
            h = nn.relu(nn.Dense(16)(x))
            return nn.Dense(4)(h) if h.sum() > 0 else -h[:, :4]

    model = MLP()
    variables = model.init(jax.random.key(0), X)

    def change():
        variables["params"]["Dense_0"]["kernel"] = variables["params"]["Dense_0"]["kernel"] * 2

    return (lambda x: model.apply(variables, x)), change, "the contents of item 'Dense_0'"


def _flax_nnx():
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.l1, self.l2 = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.relu(self.l1(x)))

    model = MLP(nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def change():  # an optimizer step updates the Variables in place
        opt.update(model, nnx.grad(lambda m: m(X).sum())(model))

    return model, change, "attribute '_raw_value'"


def _keras():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4)])

    def change():
        model.layers[0].kernel.assign(model.layers[0].kernel * 3)

    return (lambda x: model(x)), change, "attribute '_value'"


def _haiku():
    import haiku as hk

    net = hk.transform(lambda x: hk.nets.MLP([16, 4])(x))
    params = net.init(jax.random.key(0), X)

    def change():
        params["mlp/~/linear_0"]["w"] = params["mlp/~/linear_0"]["w"] + 1

    return (lambda x: net.apply(params, None, x)), change, "the contents of item 'mlp/~/linear_0'"


def _equinox():
    import equinox as eqx

    held = {"model": eqx.nn.MLP(8, 4, 16, 2, key=jax.random.key(0))}

    def change():
        held["model"] = eqx.tree_at(lambda m: m.layers[0].weight, held["model"],
                                    held["model"].layers[0].weight * 2)

    return (lambda x: jax.vmap(held["model"])(x)), change, "the contents of closure variable 'held'"


@pytest.mark.parametrize("make", [_flax_linen, _flax_nnx, _keras, _haiku, _equinox],
                         ids=["flax-linen", "flax-nnx", "keras", "haiku", "equinox"])
def test_a_model_changed_in_place_between_calls_stays_equal_to_eager(make):
    fn, change, guard = make()
    c, e = check(fn, (X,), change)
    assert e.fallback is None, e.fallback  # captured, not eager
    assert c.stats["warm"] >= 3  # replayed between the changes
    assert any(guard in f for f in e.guard_failures), e.guard_failures
