"""A flax linen stack of 16 residual MLP blocks under ``nn.scan``, written the way flax code
usually is: the blocks' parameters are stacked on a leading axis of 16. Example factories as in
``flax_mlp.py``; ``scheduled(schedule)`` runs the same blocks under a recomputation schedule of
``mlsys_jax.remat`` (every_k, sqrt_n, optimal_chain), as a user would plug one in.
"""
import flax.linen as nn
import jax
import optax

from flax_mlp import batch_of


class Block(nn.Module):
    hidden: int = 128

    @nn.compact
    def __call__(self, x, _):
        h = nn.gelu(nn.Dense(self.hidden)(nn.LayerNorm()(x)))
        return x + nn.Dense(x.shape[-1])(h), None


class ScanMLP(nn.Module):
    layers: int = 16
    width: int = 64
    hidden: int = 128
    classes: int = 10

    @nn.compact
    def __call__(self, x):
        x = nn.Dense(self.width, name="embed")(x)
        blocks = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                         length=self.layers)
        x, _ = blocks(self.hidden, name="blocks")(x, None)
        return nn.Dense(self.classes, name="head")(nn.LayerNorm(name="norm")(x))


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def _setup(n=64, features=32):
    model = ScanMLP()
    batch = batch_of(n, features, model.classes)
    return model, jax.jit(model.init)(jax.random.key(0), batch["x"]), batch  # one compile


def inspect():
    model, variables, batch = _setup(8)
    return model.apply, (variables, batch["x"])


def loss():
    model, variables, batch = _setup()
    return (lambda variables, batch: _xent(model.apply(variables, batch["x"]), batch["y"]),
            variables, batch)


def train():
    loss_fn, variables, batch = loss()
    return loss_fn, variables, batch, optax.adamw(1e-3)


def scheduled(schedule):
    """The loss of ``loss()`` with the 16 blocks run by ``remat.chain(schedule, block)``."""
    from mlsys_jax.remat import chain

    model, variables, batch = _setup()
    block = Block(model.hidden)
    run = chain(schedule, lambda p, h: block.apply({"params": p}, h, None)[0])

    def loss_fn(variables, batch):
        p = variables["params"]
        h = nn.Dense(model.width).apply({"params": p["embed"]}, batch["x"])
        h = run(p["blocks"], h)
        h = nn.LayerNorm().apply({"params": p["norm"]}, h)
        return _xent(nn.Dense(model.classes).apply({"params": p["head"]}, h), batch["y"])
    return loss_fn, variables, batch
