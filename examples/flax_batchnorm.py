"""A flax linen MLP with BatchNorm in training mode, written the way flax code usually is: the
loss applies the model with ``mutable=["batch_stats"]`` (the running statistics it updates are
dropped here) and normalises each layer by the statistics of the batch it is given. Example
factories as in ``flax_mlp.py``."""
import flax.linen as nn
import jax
import optax

from flax_mlp import batch_of


class BNMLP(nn.Module):
    width: int = 64
    classes: int = 10

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Dense(self.width)(x)
        x = nn.BatchNorm(use_running_average=not train)(x)
        return nn.Dense(self.classes)(nn.relu(x))


def loss_of(model):
    def loss_fn(variables, batch):
        logits, _ = model.apply(variables, batch["x"], train=True, mutable=["batch_stats"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn


def train():
    model = BNMLP()
    batch = batch_of(16, 32, 10)
    variables = model.init(jax.random.key(0), batch["x"], train=False)
    return loss_of(model), variables, batch, optax.adam(1e-3)
