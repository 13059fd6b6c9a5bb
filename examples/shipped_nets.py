"""Third-party nets as their libraries ship them, each as ``(loss_fn, params, batch)`` for `remat`.

- ``haiku_resnet``: ``hk.nets.ResNet`` (ResNet18's blocks, narrow widths 16–128) under
  ``hk.transform_with_state``, BatchNorm in training mode (batch statistics; the state update
  is dropped, as a loss over one batch does). haiku zero-initialises the logits layer, which
  makes every other gradient exactly zero at initialisation; the factory draws it like the
  other layers so that a gradient check compares something;
- ``keras_mobilenet_v2``: ``keras.applications.MobileNetV2(weights=None)`` called through
  ``stateless_call`` with ``training=True`` (Keras 3 on the JAX backend);
- ``equinox_vit``: the vision transformer of equinox's example notebook
  (``docs/examples/vision_transformer.ipynb``), rewritten here: patches embedded by a vmapped
  ``eqx.nn.Linear``, a class token and learned positions, blocks of vmapped ``LayerNorm``,
  ``eqx.nn.MultiheadAttention``, GELU MLP and ``eqx.nn.Dropout`` driven by keys split per block,
  the model ``jax.vmap``-ed over the batch with one key per example (the notebook rearranges
  patches with einops; a reshape does the same here);
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


def _vit_classes():
    import equinox as eqx

    class PatchEmbedding(eqx.Module):
        linear: eqx.nn.Linear
        patch: int

        def __init__(self, channels, embedding, patch, key):
            self.patch = patch
            self.linear = eqx.nn.Linear(patch * patch * channels, embedding, key=key)

        def __call__(self, x):                      # (c, h, w) -> (patches, embedding)
            c, h, w = x.shape
            p = self.patch
            x = x.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)
            return jax.vmap(self.linear)(x.reshape((h // p) * (w // p), c * p * p))

    class AttentionBlock(eqx.Module):
        layer_norm1: eqx.nn.LayerNorm
        layer_norm2: eqx.nn.LayerNorm
        attention: eqx.nn.MultiheadAttention
        linear1: eqx.nn.Linear
        linear2: eqx.nn.Linear
        dropout1: eqx.nn.Dropout
        dropout2: eqx.nn.Dropout

        def __init__(self, embedding, hidden, heads, rate, key):
            k1, k2, k3 = jax.random.split(key, 3)
            self.layer_norm1 = eqx.nn.LayerNorm(embedding)
            self.layer_norm2 = eqx.nn.LayerNorm(embedding)
            self.attention = eqx.nn.MultiheadAttention(heads, embedding, key=k1)
            self.linear1 = eqx.nn.Linear(embedding, hidden, key=k2)
            self.linear2 = eqx.nn.Linear(hidden, embedding, key=k3)
            self.dropout1 = eqx.nn.Dropout(rate)
            self.dropout2 = eqx.nn.Dropout(rate)

        def __call__(self, x, enable_dropout, key):
            h = jax.vmap(self.layer_norm1)(x)
            x = x + self.attention(h, h, h)
            h = jax.nn.gelu(jax.vmap(self.linear1)(jax.vmap(self.layer_norm2)(x)))
            k1, k2 = jax.random.split(key)
            h = self.dropout1(h, inference=not enable_dropout, key=k1)
            h = self.dropout2(jax.vmap(self.linear2)(h), inference=not enable_dropout, key=k2)
            return x + h

    class VisionTransformer(eqx.Module):
        patch_embedding: PatchEmbedding
        positional_embedding: jax.Array
        cls_token: jax.Array
        attention_blocks: list
        dropout: eqx.nn.Dropout
        mlp: eqx.nn.Sequential

        def __init__(self, embedding, hidden, heads, layers, rate, patch, patches, classes, key):
            k1, k2, k3, k4, k5 = jax.random.split(key, 5)
            self.patch_embedding = PatchEmbedding(3, embedding, patch, k1)
            self.positional_embedding = jax.random.normal(k2, (patches + 1, embedding))
            self.cls_token = jax.random.normal(k3, (1, embedding))
            self.attention_blocks = [AttentionBlock(embedding, hidden, heads, rate, k)
                                     for k in jax.random.split(k4, layers)]
            self.dropout = eqx.nn.Dropout(rate)
            self.mlp = eqx.nn.Sequential([eqx.nn.LayerNorm(embedding),
                                          eqx.nn.Linear(embedding, classes, key=k5)])

        def __call__(self, x, enable_dropout, key):
            x = jnp.concatenate((self.cls_token, self.patch_embedding(x)), axis=0)
            x = x + self.positional_embedding[:x.shape[0]]
            dropout_key, *block_keys = jax.random.split(key, len(self.attention_blocks) + 1)
            x = self.dropout(x, inference=not enable_dropout, key=dropout_key)
            for block, k in zip(self.attention_blocks, block_keys):
                x = block(x, enable_dropout, key=k)
            return self.mlp(x[0])                    # the class token
    return VisionTransformer


def equinox_vit(embedding: int = 64, hidden: int = 128, heads: int = 4, layers: int = 2,
                batch: int = 8, size: int = 32, patch: int = 4):
    model = _vit_classes()(embedding, hidden, heads, layers, 0.1, patch, (size // patch) ** 2, 10,
                           jax.random.key(0))

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
