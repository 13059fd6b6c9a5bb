"""Recurrent models as their libraries ship them, for ``mlsys-jax shard FILE.py:FN`` (factories
``(loss_fn, params, batch, optimizer)``): flax linen ``nn.RNN(nn.LSTMCell)``, a bidirectional
RNN (an LSTM forward, a GRU backward), a time-major ``nn.RNN``, flax ``nnx.RNN(nnx.LSTMCell)``,
and equinox's ``eqx.nn.LSTMCell`` vmapped over the batch inside ``lax.scan`` over time. Each
scans over time from a zero initial state: separable."""
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

B, T, F, H = 8, 6, 3, 16


def _batch():
    rng = np.random.default_rng(0)
    return {"x": jnp.asarray(rng.standard_normal((B, T, F)), jnp.float32),
            "y": jnp.asarray(rng.standard_normal((B,)), jnp.float32)}


class _Linen(nn.Module):
    bidirectional: bool = False

    @nn.compact
    def __call__(self, x):
        rnn = (nn.Bidirectional(nn.RNN(nn.LSTMCell(H)), nn.RNN(nn.GRUCell(H)))
               if self.bidirectional else nn.RNN(nn.LSTMCell(H)))
        return nn.Dense(1)(rnn(x)[:, -1])[:, 0]


def _linen(bidirectional):
    batch, model = _batch(), _Linen(bidirectional)
    params = model.init(jax.random.key(0), batch["x"])

    def loss_fn(params, batch):
        return jnp.mean((model.apply(params, batch["x"]) - batch["y"]) ** 2)
    return loss_fn, params, batch, optax.sgd(0.1)


def flax_lstm():
    return _linen(False)


def flax_bidirectional():
    """``nn.Bidirectional``: ``nn.RNN(nn.LSTMCell)`` forward, ``nn.RNN(nn.GRUCell)`` backward."""
    return _linen(True)


class _Nnx(nnx.Module):
    def __init__(self, rngs):
        self.rnn = nnx.RNN(nnx.LSTMCell(F, H, rngs=rngs))
        self.head = nnx.Linear(H, 1, rngs=rngs)

    def __call__(self, x):
        return self.head(self.rnn(x)[:, -1])[:, 0]


def nnx_rnn():
    graphdef, state = nnx.split(_Nnx(nnx.Rngs(0)))

    def loss_fn(state, batch):
        return jnp.mean((nnx.merge(graphdef, state)(batch["x"]) - batch["y"]) ** 2)
    return loss_fn, state, _batch(), optax.sgd(0.1)


class _Eqx(eqx.Module):
    cell: eqx.nn.LSTMCell
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.cell, self.head = eqx.nn.LSTMCell(F, H, key=k1), eqx.nn.Linear(H, 1, key=k2)

    def __call__(self, x):   # x: [B, T, F]
        def step(carry, xt):
            return jax.vmap(self.cell)(xt, carry), None
        zeros = jnp.zeros((x.shape[0], H))
        (h, _), _ = jax.lax.scan(step, (zeros, zeros), jnp.swapaxes(x, 0, 1))
        return jax.vmap(self.head)(h)[:, 0]


def eqx_lstm():
    def loss_fn(model, batch):
        return jnp.mean((model(batch["x"]) - batch["y"]) ** 2)
    return loss_fn, _Eqx(jax.random.key(0)), _batch(), optax.sgd(0.1)


class _TimeMajor(nn.Module):
    @nn.compact
    def __call__(self, x):   # x: [T, B, F]
        return nn.Dense(1)(nn.RNN(nn.LSTMCell(H), time_major=True)(x))[..., 0]


def flax_lstm_time_major():
    """``nn.RNN(..., time_major=True)`` on a time-major batch: every leaf is [T, B, ...]."""
    b, model = _batch(), _TimeMajor()
    batch = {"x": jnp.swapaxes(b["x"], 0, 1), "y": jnp.tile(b["y"], (T, 1))}
    params = model.init(jax.random.key(0), batch["x"])

    def loss_fn(params, batch):
        return jnp.mean((model.apply(params, batch["x"]) - batch["y"]) ** 2)
    return loss_fn, params, batch, optax.sgd(0.1)
