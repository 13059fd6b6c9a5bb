"""A small CNN in ``jax.example_libraries.stax``: ``Conv`` (with bias) and ``BatchNorm``, which in
stax always normalises with the batch's own statistics (``jax.nn.standardize``): there is no
inference mode to fold. Example factory: ``inspect`` returns ``(apply, (params, x))``."""
import jax
import jax.numpy as jnp
from jax.example_libraries import stax

init_fun, apply_fun = stax.serial(
    stax.Conv(8, (3, 3), padding="SAME"), stax.BatchNorm(), stax.Relu,
    stax.Conv(16, (3, 3), padding="SAME"), stax.BatchNorm(), stax.Relu,
    stax.Flatten, stax.Dense(10))


def inspect():
    _, params = init_fun(jax.random.key(0), (2, 16, 16, 3))
    x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3), jnp.float32)
    return apply_fun, (params, x)
