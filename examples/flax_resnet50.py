"""ResNet-50 in flax linen, written in the style of flax's ``examples/imagenet/models.py``: a
generic ``ResNet`` over ``stage_sizes`` and a block class, bottleneck blocks (1×1, 3×3, 1×1 with
4× expansion, the last BatchNorm's scale initialised to zeros), a 7×7 stride-2 stem with max
pooling, ``conv_proj``/``norm_proj`` shortcuts where the shape changes, and the conv and norm
modules handed to the blocks as ``functools.partial`` defaults. Inference mode (running averages).

``inspect`` is ResNet-50 at 224 × 224, batch 1 (25.6 M parameters, 4.1 GMACs); ``inspect_tiny`` the
same code with one block per stage, 8 filters, at 32 × 32, for tests:

    mlsys-jax inspect examples/flax_resnet50.py:inspect --hw h100
"""
from functools import partial
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class BottleneckBlock(nn.Module):
    filters: int
    conv: Any
    norm: Any
    act: Callable
    strides: tuple = (1, 1)

    @nn.compact
    def __call__(self, x):
        residual = x
        y = self.act(self.norm()(self.conv(self.filters, (1, 1))(x)))
        y = self.act(self.norm()(self.conv(self.filters, (3, 3), self.strides)(y)))
        y = self.norm(scale_init=nn.initializers.zeros_init())(
            self.conv(self.filters * 4, (1, 1))(y))
        if residual.shape != y.shape:
            residual = self.conv(self.filters * 4, (1, 1), self.strides, name="conv_proj")(x)
            residual = self.norm(name="norm_proj")(residual)
        return self.act(residual + y)


class ResNet(nn.Module):
    stage_sizes: Sequence[int]
    num_filters: int = 64
    num_classes: int = 1000
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, train: bool = False):
        conv = partial(nn.Conv, use_bias=False, dtype=self.dtype)
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                       epsilon=1e-5, dtype=self.dtype)
        x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
        x = nn.relu(norm(name="bn_init")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, blocks in enumerate(self.stage_sizes):
            for j in range(blocks):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = BottleneckBlock(self.num_filters * 2 ** i, conv, norm, nn.relu, strides)(x)
        x = jnp.mean(x, axis=(1, 2))
        return jnp.asarray(nn.Dense(self.num_classes, dtype=self.dtype)(x), self.dtype)


ResNet50 = partial(ResNet, stage_sizes=(3, 4, 6, 3))


@partial(jax.jit, static_argnums=0)
def _init(model, key, x):
    return model.init(key, x)


def _factory(model, size: int, batch: int = 1):
    x = jax.random.normal(jax.random.key(1), (batch, size, size, 3), jnp.float32)
    return model.apply, (_init(model, jax.random.key(0), x), x)


def inspect():
    return _factory(ResNet50(), 224)


def inspect_tiny():
    return _factory(ResNet(stage_sizes=(1, 1, 1, 1), num_filters=8, num_classes=10), 32)
