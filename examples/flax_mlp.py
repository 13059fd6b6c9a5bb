"""A flax linen MLP classifier, written the way flax code usually is.

The functions below are *example factories*: zero-argument functions that build the model the
way its library wants and return example arguments, parameters first (``loss(params, batch)``):

    mlsys-jax inspect examples/flax_mlp.py:inspect      # (f, args)
    mlsys-jax remat examples/flax_mlp.py:loss ...       # (loss_fn, params, batch)
    mlsys-jax shard examples/flax_mlp.py:train ...      # (loss_fn, params, batch, optimizer)
"""
from functools import partial

import flax.linen as nn
import jax
import optax


class MLP(nn.Module):
    widths: tuple = (64, 64)
    classes: int = 10
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, deterministic=True):
        for width in self.widths:
            x = nn.relu(nn.Dense(width)(x))
            x = nn.Dropout(self.dropout)(x, deterministic=deterministic)
        return nn.Dense(self.classes)(x)


@partial(jax.jit, static_argnums=(0, 1, 2))  # one compile per shape, not one per op
def batch_of(n: int, features: int, classes: int, seed: int = 1) -> dict:
    """Inputs and integer labels, a leading batch axis on both."""
    kx, ky = jax.random.split(jax.random.key(seed))
    return {"x": jax.random.normal(kx, (n, features)),
            "y": jax.random.randint(ky, (n,), 0, classes)}


def loss_of(model):
    """Mean softmax cross-entropy of ``model`` on a batch: ``loss_fn(variables, batch)``."""
    def loss_fn(variables, batch):
        logits = model.apply(variables, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn


def _setup(widths, n, features=32, classes=10, dropout=0.0):
    model = MLP(widths, classes, dropout)
    batch = batch_of(n, features, classes)
    return model, jax.jit(model.init)(jax.random.key(0), batch["x"]), batch  # one compile


def inspect():
    model, variables, batch = _setup((64, 64), 8)
    return model.apply, (variables, batch["x"])


def loss():
    model, variables, batch = _setup((256,) * 8, 64, features=256)
    return loss_of(model), variables, batch


def train():
    model, variables, batch = _setup((64, 64), 16)
    optimizer = optax.chain(optax.clip_by_global_norm(0.1), optax.adamw(1e-3))
    return loss_of(model), variables, batch, optimizer


def train_linear():
    """One Dense layer (a linear classifier): no pair of matmuls for tensor parallelism to split."""
    model, variables, batch = _setup((), 16)
    return loss_of(model), variables, batch, optax.sgd(0.1)


def train_dropout():
    """Dropout with one key closed over, as a training script that draws it once would have."""
    model, variables, batch = _setup((64, 64), 16, dropout=0.2)
    key = jax.random.key(3)

    def loss_fn(variables, batch):
        logits = model.apply(variables, batch["x"], deterministic=False, rngs={"dropout": key})
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn, variables, batch, optax.adamw(1e-3)
