"""A ResNet-18-style network in flax linen (widths 16–128, input 32×32×3), in inference mode.

Written the way flax code usually is: ``nn.Conv`` without bias followed by ``nn.BatchNorm``, basic
blocks, a strided 1×1 projection beside the strided 3×3 of each downsampling block — 20 conv+BN
pairs in all. The running statistics are random (a trained network's are not 0 and 1), so folding
BatchNorm into the convs changes every weight. Example factories: ``inspect`` (``(f, args)``,
parameters first), ``inspect_jit`` (the same model wrapped in ``jax.jit``, the usual way),
``inspect_f64`` (float64 parameters and input: run with ``--x64``).
"""
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp


class BasicBlock(nn.Module):
    features: int
    strides: int = 1
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool):
        conv = partial(nn.Conv, use_bias=False, dtype=self.dtype, param_dtype=self.dtype)
        norm = partial(nn.BatchNorm, use_running_average=not train, dtype=self.dtype,
                       param_dtype=self.dtype)
        s = (self.strides, self.strides)
        y = nn.relu(norm()(conv(self.features, (3, 3), s)(x)))
        y = norm()(conv(self.features, (3, 3))(y))
        if x.shape[-1] != self.features or self.strides != 1:
            x = norm()(conv(self.features, (1, 1), s)(x))
        return nn.relu(x + y)


class ResNet18(nn.Module):
    widths: tuple = (16, 32, 64, 128)
    classes: int = 10
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(self.widths[0], (3, 3), use_bias=False, dtype=self.dtype,
                    param_dtype=self.dtype)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, dtype=self.dtype,
                                 param_dtype=self.dtype)(x))
        for stage, width in enumerate(self.widths):
            for block in range(2):
                strides = 2 if stage > 0 and block == 0 else 1
                x = BasicBlock(width, strides, self.dtype)(x, train)
        return nn.Dense(self.classes, dtype=self.dtype, param_dtype=self.dtype)(x.mean((1, 2)))


def random_statistics(variables, dtype=jnp.float32, seed: int = 1):
    """Running means ~ N(0, 0.5²) and variances ~ U(0.5, 1.5), as after training, in ``dtype``
    (flax creates running statistics in float32 whatever the model's dtype)."""
    stats = variables["batch_stats"]
    leaves, tree = jax.tree_util.tree_flatten_with_path(stats)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    new = [jax.random.uniform(k, x.shape, dtype, 0.5, 1.5) if "var" in jax.tree_util.keystr(p)
           else 0.5 * jax.random.normal(k, x.shape, dtype) for (p, x), k in zip(leaves, keys)]
    return {**variables, "batch_stats": jax.tree_util.tree_unflatten(tree, new)}


@partial(jax.jit, static_argnums=0)
def _init(model, key, x):
    """``model.init`` compiled once per model and input shape (eager init compiles each op)."""
    return model.init(key, x)


def _setup(dtype=jnp.float32):
    model = ResNet18(dtype=dtype)
    x = jax.random.normal(jax.random.key(2), (2, 32, 32, 3), dtype)
    variables = random_statistics(_init(model, jax.random.key(0), x), dtype)
    return model, variables, x


def inspect():
    model, variables, x = _setup()
    return model.apply, (variables, x)


def inspect_jit():
    model, variables, x = _setup()
    return jax.jit(model.apply), (variables, x)


def inspect_f64():
    model, variables, x = _setup(jnp.float64)
    return model.apply, (variables, x)
