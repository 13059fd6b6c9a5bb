"""Third-party nets as their libraries ship them, each as ``(loss_fn, params, batch)`` for `remat`.

- ``haiku_resnet``: ``hk.nets.ResNet`` (ResNet18's blocks, narrow widths 16–128) under
  ``hk.transform_with_state``, BatchNorm in training mode (batch statistics; the state update
  is dropped, as a loss over one batch does). haiku zero-initialises the logits layer, which
  makes every other gradient exactly zero at initialisation; the factory draws it like the
  other layers so that a gradient check compares something;
- ``keras_mobilenet_v2``: ``keras.applications.MobileNetV2(weights=None)`` called through
  ``stateless_call`` with ``training=True`` (Keras 3 on the JAX backend);
- ``equinox_vit``: the vision transformer of equinox's example notebook
  (``docs/examples/vision_transformer.ipynb``) as ``examples/equinox_vit.py`` writes it, the
  model ``jax.vmap``-ed over the batch with one dropout key per example;
- ``penzai_llama``: penzai's shipped llama-like transformer (``llamalike_common``) with a
  next-token cross-entropy over its named-axis logits.

Sizes are small enough for the test suite; the notebook's ViT (embedding 512, 6 layers, batch
64) is ``equinox_vit(embedding=512, hidden=256, heads=8, layers=6, batch=64)``.

    mlsys-jax remat examples/shipped_nets.py:haiku_resnet --budget 100%
"""
import os

import jax
import jax.numpy as jnp
import optax
from equinox_vit import VisionTransformer  # examples/, on the path as a target's folder


def _labels(batch: int, classes: int = 10):
    return jax.random.randint(jax.random.key(2), (batch,), 0, classes)


def haiku_resnet(batch: int = 8, size: int = 32):
    import haiku as hk

    def forward(x, is_training):
        net = hk.nets.ResNet([2, 2, 2, 2], num_classes=10, bottleneck=False,
                             channels_per_group=(16, 32, 64, 128),
                             initial_conv_config={"output_channels": 16},
                             logits_config={"w_init": hk.initializers.VarianceScaling()})
        return net(x, is_training=is_training)

    model = hk.transform_with_state(forward)
    images = jax.random.normal(jax.random.key(1), (batch, size, size, 3))
    params, state = jax.jit(model.init, static_argnames="is_training")(
        jax.random.key(0), images, is_training=True)

    def loss_fn(params, data):
        logits, _ = model.apply(params, state, None, data["images"], is_training=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, data["labels"]).mean()
    return loss_fn, params, {"images": images, "labels": _labels(batch)}


def keras_mobilenet_v2(batch: int = 2, size: int = 96):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    model = keras.applications.MobileNetV2(weights=None, input_shape=(size, size, 3), classes=10)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]   # BatchNorm's moving statistics

    def loss_fn(trainable, data):
        probs, _ = model.stateless_call(trainable, frozen, data["images"], training=True)
        picked = jnp.take_along_axis(probs, data["labels"][:, None], axis=1)
        return -jnp.mean(jnp.log(picked + 1e-7))       # the model ends in a softmax
    images = jax.random.normal(jax.random.key(1), (batch, size, size, 3))
    return loss_fn, trainable, {"images": images, "labels": _labels(batch)}


def equinox_vit(embedding: int = 64, hidden: int = 128, heads: int = 4, layers: int = 2,
                batch: int = 8, size: int = 32, patch: int = 4):
    model = VisionTransformer(embedding, hidden, heads, layers, 0.1, patch, (size // patch) ** 2,
                              10, 3, jax.random.key(0))

    def loss_fn(model, data):
        logits = jax.vmap(model, in_axes=(0, None, 0))(data["images"], True, data["keys"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, data["labels"]).mean()
    images = jax.random.normal(jax.random.key(1), (batch, 3, size, size))
    data = {"images": images, "labels": _labels(batch),
            "keys": jax.random.split(jax.random.key(3), batch)}
    return loss_fn, model, data


def penzai_llama(layers: int = 2, d_model: int = 64, heads: int = 4, vocab: int = 256,
                 seq: int = 32, batch: int = 4):
    from penzai import pz
    from penzai.models.transformer.variants import llamalike_common

    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=heads, query_head_multiplier=1, embedding_dim=d_model,
        projection_dim=d_model // heads, mlp_hidden_dim=2 * d_model, num_decoder_blocks=layers,
        vocab_size=vocab, mlp_variant="swiglu", tie_embedder_and_logits=False,
        parameter_dtype=jnp.float32, activation_dtype=jnp.float32)
    model = llamalike_common.build_llamalike_transformer(config, init_base_rng=jax.random.key(0))
    unbound, variables = pz.unbind_variables(model, freeze=True)
    tokens = jax.random.randint(jax.random.key(1), (batch, seq + 1), 0, vocab)

    def loss_fn(variables, data):
        bound = pz.bind_variables(unbound, variables)
        ids = pz.nx.wrap(data["tokens"][:, :-1], "batch", "seq")
        logits = bound(ids, token_positions=pz.nx.arange("seq", seq)).unwrap("batch", "seq",
                                                                               "vocabulary")
        return optax.softmax_cross_entropy_with_integer_labels(logits, data["tokens"][:, 1:]).mean()
    return loss_fn, variables, {"tokens": tokens}
