"""A linear classifier on inputs centred by the batch's own mean (``x - x.mean(0)``), its weights
zero-initialised, in plain JAX: at the initial parameters every logit is zero, so the loss is
``log(classes)`` for the whole batch and for every shard alike — but the gradient of the weights
is the centred inputs' correlation with the labels, and centring by a shard's mean is not centring
by the batch's.

    mlsys-jax shard examples/centred_inputs.py:train --mesh data=4
"""
import jax
import jax.numpy as jnp
import optax


def loss_fn(params, batch):
    x = batch["x"] - batch["x"].mean(axis=0)
    logits = x @ params["w"] + params["b"]
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def train(n: int = 16, features: int = 8, classes: int = 4):
    kx, ky = jax.random.split(jax.random.key(1))
    batch = {"x": 1.0 + jax.random.normal(kx, (n, features)),
             "y": jax.random.randint(ky, (n,), 0, classes)}
    params = {"w": jnp.zeros((features, classes)), "b": jnp.zeros((classes,))}
    return loss_fn, params, batch, optax.sgd(0.1)
