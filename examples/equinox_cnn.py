"""A small CNN in equinox, written the way equinox code usually is: layers act on one example
(``Conv2d`` on CHW), the model is vmapped over the batch with a named axis for ``BatchNorm``, whose
running statistics live in an ``eqx.nn.State``; ``eqx.nn.inference_mode`` switches BatchNorm to
its running statistics. Example factory: ``inspect`` returns ``(f, (model, x, state))``."""
import equinox as eqx
import jax
import jax.numpy as jnp


class CNN(eqx.Module):
    convs: list
    norms: list
    head: eqx.nn.Linear

    def __init__(self, widths=(8, 16, 16), key=None):
        keys = jax.random.split(key, len(widths) + 1)
        cins = (3,) + tuple(widths[:-1])
        self.convs = [eqx.nn.Conv2d(cin, cout, 3, padding=1, key=k)
                      for cin, cout, k in zip(cins, widths, keys)]
        self.norms = [eqx.nn.BatchNorm(cout, axis_name="batch", mode="ema") for cout in widths]
        self.head = eqx.nn.Linear(widths[-1], 10, key=keys[-1])

    def __call__(self, x, state):
        for conv, norm in zip(self.convs, self.norms):
            x, state = norm(conv(x), state)
            x = jax.nn.relu(x)
        return self.head(x.mean((1, 2))), state


def forward(model, x, state):
    """The batched forward pass, as equinox users write it."""
    logits, _ = jax.vmap(model, axis_name="batch", in_axes=(0, None),
                         out_axes=(0, None))(x, state)
    return logits


def random_statistics(model, state, seed: int = 1):
    """Running means ~ N(0, 0.5²), variances ~ U(0.5, 1.5), as after training."""
    key = jax.random.key(seed)
    for norm in model.norms:
        key, km, kv = jax.random.split(key, 3)
        mean, var = state.get(norm.ema_state_index)
        state = state.set(norm.ema_state_index, (0.5 * jax.random.normal(km, mean.shape),
                                             jax.random.uniform(kv, var.shape, minval=0.5,
                                                                maxval=1.5)))
    return state


def inspect():
    model, state = eqx.nn.make_with_state(CNN)(key=jax.random.key(0))
    state = random_statistics(model, state)
    x = jax.random.normal(jax.random.key(2), (4, 3, 16, 16), jnp.float32)
    return forward, (eqx.nn.inference_mode(model), x, state)
