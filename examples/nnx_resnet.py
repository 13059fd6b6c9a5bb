"""The ResNet-18-style network of ``flax_resnet.py`` in flax nnx: the module is the parameter
pytree (``nnx.Conv`` + ``nnx.BatchNorm(use_running_average=True)``), random running statistics.
Example factory: ``inspect`` returns ``(f, (model, x))``."""
import jax
import jax.numpy as jnp
from flax import nnx


class BasicBlock(nnx.Module):
    def __init__(self, cin, cout, strides, rngs):
        s = (strides, strides)
        self.conv1 = nnx.Conv(cin, cout, (3, 3), strides=s, use_bias=False, rngs=rngs)
        self.bn1 = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)
        self.conv2 = nnx.Conv(cout, cout, (3, 3), use_bias=False, rngs=rngs)
        self.bn2 = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)
        self.proj = self.proj_bn = nnx.data(None)  # nnx: a submodule slot that may stay empty
        if cin != cout or strides != 1:
            self.proj = nnx.Conv(cin, cout, (1, 1), strides=s, use_bias=False, rngs=rngs)
            self.proj_bn = nnx.BatchNorm(cout, use_running_average=True, rngs=rngs)

    def __call__(self, x):
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.proj is not None:
            x = self.proj_bn(self.proj(x))
        return nnx.relu(x + y)


class ResNet18(nnx.Module):
    def __init__(self, widths=(16, 32, 64, 128), classes=10, *, rngs):
        self.stem = nnx.Conv(3, widths[0], (3, 3), use_bias=False, rngs=rngs)
        self.stem_bn = nnx.BatchNorm(widths[0], use_running_average=True, rngs=rngs)
        blocks, cin = [], widths[0]
        for stage, width in enumerate(widths):
            for block in range(2):
                blocks.append(BasicBlock(cin, width, 2 if stage > 0 and block == 0 else 1, rngs))
                cin = width
        self.blocks = nnx.List(blocks)
        self.head = nnx.Linear(widths[-1], classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.stem_bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean((1, 2)))


def randomise_statistics(model, seed: int = 1):
    """Running means ~ N(0, 0.5²), variances ~ U(0.5, 1.5), as after training."""
    key = jax.random.key(seed)
    for _, bn in nnx.iter_graph(model):
        if isinstance(bn, nnx.BatchNorm):
            key, km, kv = jax.random.split(key, 3)
            bn.mean[...] = 0.5 * jax.random.normal(km, bn.mean.shape)
            bn.var[...] = jax.random.uniform(kv, bn.var.shape, minval=0.5, maxval=1.5)
    return model


def inspect():
    model = randomise_statistics(ResNet18(rngs=nnx.Rngs(0)))
    x = jax.random.normal(jax.random.key(2), (2, 32, 32, 3), jnp.float32)
    return (lambda model, x: model(x)), (model, x)
