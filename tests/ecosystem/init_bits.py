"""Example models built with threefry's non-partitionable lowering of their random draws.

JAX lowers threefry so that it partitions across devices (``jax_threefry_partitionable``, on by
default since JAX 0.5); on XLA:CPU that form takes several times as long to compile, and a
model's initialisation, a random draw per parameter (flax's and haiku's jitted ``init``, nnx's
and equinox's op by op), is most of what building an example model costs here. The other
lowering (JAX's default before 0.5) draws from the same distributions; only which bits come out
changes, and no test that builds its model under these depends on which values are drawn.

Only the building runs under them: the programs a test judges (a loss's gradient, dropout's bits
included) are traced and compiled with JAX's defaults, or hold no random draw (the inference
ResNet that ``optimize`` rewrites, checks and times).
"""
import contextlib

import jax


@contextlib.contextmanager
def init_bits():
    """For a factory called in this thread (the setting is per thread)."""
    with jax.threefry_partitionable(False):
        yield


@contextlib.contextmanager
def init_bits_everywhere():
    """For a factory the CLI calls (in a thread of its own): the process-wide setting, restored
    after."""
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", False)
    try:
        yield
    finally:
        jax.config.update("jax_threefry_partitionable", before)
