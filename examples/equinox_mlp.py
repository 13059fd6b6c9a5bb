"""An equinox MLP classifier, written the way equinox code usually is: the module is the
parameter pytree (its activation function is a static, non-array leaf) and is vmapped over the
batch. Example factories as in ``flax_mlp.py``."""
import equinox as eqx
import jax
import optax

from flax_mlp import batch_of


def make_model(features=32, classes=10, width=64, depth=2, seed=0):
    return eqx.nn.MLP(features, classes, width, depth, activation=jax.nn.relu,
                      key=jax.random.key(seed))


def loss_fn(model, batch):
    logits = jax.vmap(model)(batch["x"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()


def inspect():
    return (lambda model, x: jax.vmap(model)(x)), (make_model(), batch_of(8, 32, 10)["x"])


def loss():
    return loss_fn, make_model(), batch_of(16, 32, 10)


def train():
    optimizer = optax.chain(optax.clip_by_global_norm(0.1), optax.adamw(1e-3))
    return loss_fn, make_model(), batch_of(16, 32, 10), optimizer
