"""Tiny factories for the API's tests: a linear least-squares step (NumPy-built, no model
library), one batch that splits over 2, 4 and 8 devices and one that does not."""
import jax.numpy as jnp
import numpy as np
import optax


def loss(params, batch):
    return jnp.mean((batch["x"] @ params["w"] - batch["y"]) ** 2)


def _batch(rows: int) -> dict:
    rng = np.random.default_rng(0)
    return {"x": jnp.asarray(rng.normal(size=(rows, 8)), jnp.float32),
            "y": jnp.asarray(rng.normal(size=(rows, 2)), jnp.float32)}


def linear():
    """(loss_fn, params, batch, optimizer): the shard command's factory."""
    params = {"w": jnp.asarray(np.full((8, 2), 0.1), jnp.float32)}
    return loss, params, _batch(8), optax.sgd(0.1)


def six_rows():
    """A batch of 6 rows: it does not split over 4 or 8 devices."""
    loss_fn, params, _, optimizer = linear()
    return loss_fn, params, _batch(6), optimizer


def predict():
    """(f, args): the inspect command's factory."""
    w = jnp.asarray(np.full((8, 2), 0.1), jnp.float32)
    return (lambda w, x: jnp.tanh(x @ w)), (w, _batch(8)["x"])
