"""Image classifiers in inference mode, built the way their libraries build them: example
factories ``(f, args)``, parameters first, for ``inspect`` and ``optimize``.

- ``flax_resnet18``: a ResNet-18 written after flax's ``examples/imagenet/models.py`` (read
  there, not copied): a 7×7 stride-2 stem without bias, BatchNorm (momentum 0.9, epsilon 1e-5),
  a 3×3 stride-2 max pool, basic blocks whose second norm starts at zero scale, a strided 1×1
  projection where the shape changes, global mean and a dense head; widths 64–512.
- ``haiku_resnet18``: ``hk.nets.ResNet18`` as shipped, under ``hk.transform_with_state`` (its
  BatchNorm keeps moving averages in haiku *state*), applied with ``is_training=False``.
- ``keras_mobilenet``: ``keras.applications.MobileNetV2(weights=None, alpha=...)`` (depthwise
  convolutions) and ``keras_resnet50``: ``keras.applications.ResNet50(weights=None)``, both with
  the JAX backend through ``model.stateless_call(trainable, non_trainable, x, training=False)``.

    mlsys-jax inspect examples/inference_nets.py:haiku_resnet18 --hw here --measure
"""
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

from functools import partial  # noqa: E402

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402


class _Basic(nn.Module):
    """Two 3×3 conv+BN, the second BN's scale zero at init (flax's imagenet idiom)."""
    width: int
    stride: int = 1

    @nn.compact
    def __call__(self, x):
        bn = partial(nn.BatchNorm, use_running_average=True, momentum=0.9, epsilon=1e-5)
        conv = partial(nn.Conv, use_bias=False)
        h = nn.relu(bn()(conv(self.width, (3, 3), (self.stride, self.stride))(x)))
        h = bn(scale_init=nn.initializers.zeros_init())(conv(self.width, (3, 3))(h))
        if h.shape != x.shape:
            x = bn(name="norm_proj")(conv(self.width, (1, 1), (self.stride, self.stride),
                                          name="conv_proj")(x))
        return nn.relu(h + x)


class ImagenetResNet18(nn.Module):
    classes: int = 1000
    width: int = 64

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(self.width, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False,
                    name="conv_init")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True, momentum=0.9, epsilon=1e-5,
                                 name="bn_init")(x))
        x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
        for stage in range(4):
            for block in range(2):
                x = _Basic(self.width * 2 ** stage, 2 if stage and not block else 1)(x)
        return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))


def _images(batch: int, size: int):
    return jax.random.normal(jax.random.key(1), (batch, size, size, 3))


def _trained_statistics(variables, seed: int = 2):
    """Running means ~ N(0, 0.5²), variances ~ U(0.5, 1.5) and BN scales ~ U(0.5, 1.5), as after
    training (a zero scale would make every block's branch vanish from a value check)."""
    leaves, tree = jax.tree_util.tree_flatten_with_path(variables)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = []
    for (path, x), k in zip(leaves, keys):
        name = jax.tree_util.keystr(path)
        if not jnp.issubdtype(x.dtype, jnp.floating):
            pass  # haiku's EMA counters
        elif "var" in name or name.endswith("['scale']"):
            x = jax.random.uniform(k, x.shape, x.dtype, 0.5, 1.5)
        elif "mean" in name:
            x = 0.5 * jax.random.normal(k, x.shape, x.dtype)
        out.append(x)
    return jax.tree_util.tree_unflatten(tree, out)


def flax_resnet18(batch: int = 2, size: int = 64, classes: int = 1000, width: int = 64):
    model = ImagenetResNet18(classes, width)
    x = _images(batch, size)
    variables = _trained_statistics(jax.jit(model.init)(jax.random.key(0), x))
    return model.apply, (variables, x)


def haiku_resnet18(batch: int = 2, size: int = 64, classes: int = 1000):
    import haiku as hk

    net = hk.transform_with_state(
        lambda x, is_training: hk.nets.ResNet18(classes)(x, is_training=is_training))
    x = _images(batch, size)
    params, state = jax.jit(net.init, static_argnums=2)(jax.random.key(0), x, True)
    state = _trained_statistics(state)

    def apply(variables, x):
        return net.apply(*variables, None, x, False)[0]
    return apply, ((params, state), x)


def _keras(model, batch: int, size: int):
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]

    def apply(variables, x):
        return model.stateless_call(*variables, x, training=False)[0]
    return apply, ((trainable, frozen), _images(batch, size))


def _keras_module():
    import keras

    if keras.backend.backend() != "jax":
        raise RuntimeError(f"set KERAS_BACKEND=jax before keras is imported (it is "
                           f"{keras.backend.backend()!r})")
    keras.utils.set_random_seed(0)
    return keras


def keras_mobilenet(batch: int = 2, size: int = 96, alpha: float = 0.35, classes: int = 1000):
    keras = _keras_module()
    model = keras.applications.MobileNetV2(input_shape=(size, size, 3), alpha=alpha,
                                           weights=None, classes=classes)
    return _keras(model, batch, size)


def keras_resnet50(batch: int = 2, size: int = 64, classes: int = 1000):
    keras = _keras_module()
    model = keras.applications.ResNet50(input_shape=(size, size, 3), weights=None,
                                        classes=classes)
    return _keras(model, batch, size)
