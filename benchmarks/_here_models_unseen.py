"""Models the ``here`` model was not tuned on (figures of ``bench passes``): each from a library
or an architecture outside ``_here_model.MODELS``, small enough for a shared CPU.

- ``haiku_resnet18_train``: ``hk.nets.ResNet18`` in training mode (BatchNorm normalises by the
  batch's own statistics: reductions inside the net, which the tuning set's inference nets
  never run), 64 × 64, batch 4;
- ``equinox_mlp_mixer``: an MLP-Mixer in equinox (per-example modules under ``jax.vmap``; token
  mixing transposes patches × channels every block), 32 × 32, patches 4 × 4, batch 8;
- ``nnx_cnn``: a VGG-style flax nnx CNN (3 × 3 convs, BatchNorm with running averages,
  max-pooling, a dense head), 32 × 32, batch 8;
- ``keras_convnext``: a ConvNeXt-like Keras model (patchify stem, depthwise 7 × 7 convs,
  LayerNorm, inverted MLP, layer scale, residual), 64 × 64, batch 2.

Each factory returns ``(f, args)``: ``f(*args)`` is the model's forward pass, its parameters
arguments (as ``inspect`` sees a factory's model).
"""
from __future__ import annotations

import os
from pathlib import Path

import jax

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _inference_nets():
    from benchmarks._cpu_model import _example

    return _example(EXAMPLES / "inference_nets.py")


def _images(batch: int, size: int, channels_first: bool = False):
    shape = (batch, 3, size, size) if channels_first else (batch, size, size, 3)
    return jax.random.normal(jax.random.key(1), shape)


def haiku_resnet18_train(batch: int = 4, size: int = 64, classes: int = 100):
    import haiku as hk

    net = hk.transform_with_state(
        lambda x: hk.nets.ResNet18(classes)(x, is_training=True))
    x = _images(batch, size)
    params, state = jax.jit(net.init)(jax.random.key(0), x)

    def apply(variables, x):
        return net.apply(*variables, None, x)[0]
    return apply, ((params, state), x)


def equinox_mlp_mixer(batch: int = 8, size: int = 32, patch: int = 4, dim: int = 64,
                      blocks: int = 4, classes: int = 10):
    import equinox as eqx

    tokens = (size // patch) ** 2
    keys = iter(jax.random.split(jax.random.key(0), 4 * blocks + 2))

    class MixerBlock(eqx.Module):
        norm1: eqx.nn.LayerNorm
        token: eqx.nn.MLP
        norm2: eqx.nn.LayerNorm
        channel: eqx.nn.MLP

        def __init__(self):
            self.norm1, self.norm2 = eqx.nn.LayerNorm(dim), eqx.nn.LayerNorm(dim)
            self.token = eqx.nn.MLP(tokens, tokens, tokens, 1, activation=jax.nn.gelu,
                                    key=next(keys))
            self.channel = eqx.nn.MLP(dim, dim, 2 * dim, 1, activation=jax.nn.gelu,
                                      key=next(keys))

        def __call__(self, x):  # x: (tokens, dim)
            y = jax.vmap(self.norm1)(x).T
            x = x + jax.vmap(self.token)(y).T
            return x + jax.vmap(self.channel)(jax.vmap(self.norm2)(x))

    class Mixer(eqx.Module):
        stem: eqx.nn.Conv2d
        blocks: list
        norm: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self):
            self.stem = eqx.nn.Conv2d(3, dim, patch, stride=patch, key=next(keys))
            self.blocks = [MixerBlock() for _ in range(blocks)]
            self.norm = eqx.nn.LayerNorm(dim)
            self.head = eqx.nn.Linear(dim, classes, key=next(keys))

        def __call__(self, image):  # image: (3, size, size)
            x = self.stem(image).reshape(dim, tokens).T
            for b in self.blocks:
                x = b(x)
            return self.head(jax.vmap(self.norm)(x).mean(0))

    params, static = eqx.partition(Mixer(), eqx.is_array)

    def apply(params, images):
        return jax.vmap(eqx.combine(params, static))(images)
    return apply, (params, _images(batch, size, channels_first=True))


def nnx_cnn(batch: int = 8, size: int = 32, widths=(32, 64, 128), classes: int = 10):
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs):
            convs, norms, cin = [], [], 3
            for w in widths:
                for _ in range(2):
                    convs.append(nnx.Conv(cin, w, (3, 3), use_bias=False, rngs=rngs))
                    norms.append(nnx.BatchNorm(w, use_running_average=True, rngs=rngs))
                    cin = w
            self.convs, self.norms = nnx.List(convs), nnx.List(norms)
            self.head = nnx.Linear(cin, classes, rngs=rngs)

        def __call__(self, x):
            for i, (conv, norm) in enumerate(zip(self.convs, self.norms)):
                x = nnx.relu(norm(conv(x)))
                if i % 2:
                    x = nnx.max_pool(x, (2, 2), strides=(2, 2))
            return self.head(x.mean((1, 2)))

    graphdef, state = nnx.split(CNN(nnx.Rngs(0)))

    def apply(state, x):
        return nnx.merge(graphdef, state)(x)
    return apply, (state, _images(batch, size))


def keras_convnext(batch: int = 2, size: int = 64, dims=(32, 64), depths=(2, 2),
                   classes: int = 10):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    from keras import layers

    if keras.backend.backend() != "jax":
        raise RuntimeError("set KERAS_BACKEND=jax before keras is imported")
    keras.utils.set_random_seed(0)
    inputs = keras.Input((size, size, 3))
    x = layers.Conv2D(dims[0], 4, strides=4)(inputs)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    for stage, (dim, depth) in enumerate(zip(dims, depths)):
        if stage:
            x = layers.LayerNormalization(epsilon=1e-6)(x)
            x = layers.Conv2D(dim, 2, strides=2)(x)
        for _ in range(depth):
            y = layers.DepthwiseConv2D(7, padding="same")(x)
            y = layers.LayerNormalization(epsilon=1e-6)(y)
            y = layers.Dense(4 * dim, activation="gelu")(y)
            y = layers.Dense(dim)(y)
            x = layers.Add()([x, layers.Rescaling(1e-6)(y)])  # layer scale, fixed
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    # inference_nets' Keras wrapper: stateless_call at inference on its seeded images
    return _inference_nets()._keras(keras.Model(inputs, layers.Dense(classes)(x)), batch, size)


def haiku_resnet18_224px():
    """``hk.nets.ResNet18`` at inference, 224 × 224, batch 1: XLA runs the last stage's six
    convolutions, their BatchNorms and the global mean as one YNNPACK graph fusion, slower than
    the same work as separate kernels: the model times that graph alone too
    (``cost/here/graphs.py``)."""
    return _inference_nets().haiku_resnet18(batch=1, size=224)


MODELS = {"haiku_resnet18_train_64px": haiku_resnet18_train,
          "equinox_mlp_mixer_32px": equinox_mlp_mixer,
          "nnx_cnn_32px": nnx_cnn,
          "keras_convnext_64px": keras_convnext,
          "haiku_resnet18_224px": haiku_resnet18_224px}
# bench --quick: one, the cheapest to measure (~13 CPU-s against the haiku ResNet18's ~30:
# its 3x3x512x512 convolution at 2x2 runs 66 ms); the full tier has all five
QUICK = ("equinox_mlp_mixer_32px",)
LIBRARIES = {"haiku_resnet18_train_64px": "haiku", "equinox_mlp_mixer_32px": "equinox",
             "nnx_cnn_32px": "flax nnx", "keras_convnext_64px": "keras",
             "haiku_resnet18_224px": "haiku"}


def equinox_vit_loss():
    """The equinox ViT of ``examples/shipped_nets.py`` (2 layers, 64 wide, dropout on: PRNG
    keys split per layer), its training loss as a factory ``(f, (model, batch))`` — the
    cold-start figure's model."""
    from benchmarks._cpu_model import _example

    f, model, data = _example(EXAMPLES / "shipped_nets.py").equinox_vit()
    return f, (model, data)
