"""A ResNet v1.5 written after flax's ``examples/imagenet`` (``models.py`` and ``train.py``; read
there, not copied): ``nn.BatchNorm(axis_name='batch', momentum=0.9, epsilon=1e-5)`` in every
block (synchronised BatchNorm: the example pmaps its step over an axis named ``batch``), the last
norm of each residual branch zero-initialised (``scale_init=zeros``), convolutions without bias,
and the example's loss: the mean softmax cross-entropy plus ``1e-4 * 0.5 *`` the squared norm of
every kernel (``x.ndim > 1``), with ``mutable=['batch_stats']``.

    mlsys-jax shard examples/flax_imagenet.py:train --mesh data=4 --axis-name batch=data
"""
from functools import partial
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


class ResNetBlock(nn.Module):
    filters: int
    conv: nn.Module
    norm: nn.Module
    strides: tuple = (1, 1)

    @nn.compact
    def __call__(self, x):
        y = self.conv(self.filters, (3, 3), self.strides)(x)
        y = nn.relu(self.norm()(y))
        y = self.conv(self.filters, (3, 3))(y)
        y = self.norm(scale_init=nn.initializers.zeros_init())(y)
        if x.shape != y.shape:
            x = self.norm(name="norm_proj")(
                self.conv(self.filters, (1, 1), self.strides, name="conv_proj")(x))
        return nn.relu(x + y)


class ResNet(nn.Module):
    stage_sizes: Sequence[int]
    num_classes: int
    num_filters: int = 64

    @nn.compact
    def __call__(self, x, train: bool = True):
        conv = partial(nn.Conv, use_bias=False)
        norm = partial(nn.BatchNorm, use_running_average=not train, momentum=0.9, epsilon=1e-5,
                       axis_name="batch")
        x = conv(self.num_filters, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], name="conv_init")(x)
        x = nn.relu(norm(name="bn_init")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for i, size in enumerate(self.stage_sizes):
            for j in range(size):
                strides = (2, 2) if i > 0 and j == 0 else (1, 1)
                x = ResNetBlock(self.num_filters * 2 ** i, conv, norm, strides)(x)
        x = jnp.mean(x, axis=(1, 2))
        return nn.Dense(self.num_classes)(x)


def loss_of(model, batch_stats):
    def loss_fn(params, batch):
        logits, _ = model.apply({"params": params, "batch_stats": batch_stats}, batch["image"],
                                mutable=["batch_stats"])
        one_hot = jax.nn.one_hot(batch["label"], model.num_classes)
        loss = optax.softmax_cross_entropy(logits=logits, labels=one_hot).mean()
        l2 = sum(jnp.sum(x ** 2) for x in jax.tree.leaves(params) if x.ndim > 1)
        return loss + 1e-4 * 0.5 * l2
    return loss_fn


def train(n: int = 8, size: int = 16, classes: int = 10):
    """A one-stage ResNet (the example's ``_ResNet1`` test model) with 8 filters."""
    model = ResNet(stage_sizes=[1], num_classes=classes, num_filters=8)
    kx, ky = jax.random.split(jax.random.key(1))
    batch = {"image": jax.random.normal(kx, (n, size, size, 3)),
             "label": jax.random.randint(ky, (n,), 0, classes)}
    # as the example does: outside its pmap, on one image (flax skips the pmean while it
    # initialises, so no axis needs to be bound here)
    variables = jax.jit(model.init)({"params": jax.random.key(0)}, jnp.ones((1, size, size, 3)))
    optimizer = optax.sgd(0.1, momentum=0.9, nesterov=True)
    return loss_of(model, variables["batch_stats"]), variables["params"], batch, optimizer
