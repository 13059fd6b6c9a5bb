"""A flax linen MLP with BatchNorm in training mode, written the way flax code usually is: the
loss applies the model with ``mutable=["batch_stats"]`` (the running statistics it updates are
dropped here) and normalises each layer by the statistics of the batch it is given. Example
factories as in ``flax_mlp.py``; ``train_zero_head`` starts the classifier at zero."""
from typing import Callable

import flax.linen as nn
import jax
import optax

from flax_mlp import batch_of


class BNMLP(nn.Module):
    width: int = 64
    classes: int = 10
    head_init: Callable = nn.initializers.lecun_normal()

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Dense(self.width)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        return nn.Dense(self.classes, kernel_init=self.head_init)(nn.relu(x))


def loss_of(model):
    def loss_fn(variables, batch):
        logits, _ = model.apply(variables, batch["x"], train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn


def train(model=None):
    model = BNMLP() if model is None else model
    batch = batch_of(16, 32, 10)
    variables = jax.jit(model.init, static_argnames="train")(jax.random.key(0), batch["x"],
                                                                train=False)
    return loss_of(model), variables, batch, optax.adam(1e-3)


def train_zero_head():
    """The head zero-initialised (``nn.Dense(10, kernel_init=zeros)``), as fine-tuning code often
    starts a new classifier: every logit is the bias at first, so the loss is the same for the
    whole batch and for each shard whatever BatchNorm does — but the gradients are not."""
    return train(BNMLP(head_init=nn.initializers.zeros))
