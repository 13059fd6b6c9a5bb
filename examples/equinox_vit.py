"""A Vision Transformer written after equinox's ``docs/examples/vision_transformer.ipynb`` (read
there, not copied): a patch embedding (``eqx.nn.Linear`` on flattened patches), a class token and
learned position embeddings, attention blocks of ``eqx.nn.MultiheadAttention`` and a GELU MLP
(``linear1``, ``linear2``) with dropout, and the example's head ``eqx.nn.Sequential([LayerNorm,
Linear])`` on the class token. The model sees one image; the loss vmaps it over the batch with one
dropout key per example (``in_axes=(0, None, 0)``), as the example's ``compute_grads`` does, so the
keys are part of the batch.

    mlsys-jax shard examples/equinox_vit.py:train --mesh data=2,model=2
"""
import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax


class PatchEmbedding(eqx.Module):
    linear: eqx.nn.Linear
    patch_size: int = eqx.field(static=True)

    def __init__(self, channels: int, dim: int, patch_size: int, key):
        self.patch_size = patch_size
        self.linear = eqx.nn.Linear(patch_size ** 2 * channels, dim, key=key)

    def __call__(self, x):                      # (c, h, w) -> (patches, dim)
        c, h, w = x.shape
        p = self.patch_size
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

    def __init__(self, dim: int, hidden: int, heads: int, dropout: float, key):
        k1, k2, k3 = jr.split(key, 3)
        self.layer_norm1, self.layer_norm2 = eqx.nn.LayerNorm(dim), eqx.nn.LayerNorm(dim)
        self.attention = eqx.nn.MultiheadAttention(heads, dim, key=k1)
        self.linear1 = eqx.nn.Linear(dim, hidden, key=k2)
        self.linear2 = eqx.nn.Linear(hidden, dim, key=k3)
        self.dropout1, self.dropout2 = eqx.nn.Dropout(dropout), eqx.nn.Dropout(dropout)

    def __call__(self, x, enable_dropout: bool, key):
        h = jax.vmap(self.layer_norm1)(x)
        x = x + self.attention(h, h, h)
        h = jax.nn.gelu(jax.vmap(self.linear1)(jax.vmap(self.layer_norm2)(x)))
        k1, k2 = jr.split(key)
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

    def __init__(self, dim, hidden, heads, layers, dropout, patch_size, patches, classes,
                 channels, key):
        k1, k2, k3, k4, k5 = jr.split(key, 5)
        self.patch_embedding = PatchEmbedding(channels, dim, patch_size, k1)
        self.positional_embedding = jr.normal(k2, (patches + 1, dim))
        self.cls_token = jr.normal(k3, (1, dim))
        self.attention_blocks = [AttentionBlock(dim, hidden, heads, dropout, k)
                                 for k in jr.split(k4, layers)]
        self.dropout = eqx.nn.Dropout(dropout)
        self.mlp = eqx.nn.Sequential([eqx.nn.LayerNorm(dim), eqx.nn.Linear(dim, classes, key=k5)])

    def __call__(self, x, enable_dropout: bool, key):
        x = jnp.concatenate((self.cls_token, self.patch_embedding(x)), axis=0)
        x = x + self.positional_embedding[: x.shape[0]]
        dropout_key, *keys = jr.split(key, len(self.attention_blocks) + 1)
        x = self.dropout(x, inference=not enable_dropout, key=dropout_key)
        for block, k in zip(self.attention_blocks, keys):
            x = block(x, enable_dropout, k)
        return self.mlp(x[0])                   # the class token


def loss_fn(model, batch):
    logits = jax.vmap(model, in_axes=(0, None, 0))(batch["images"], True, batch["keys"])
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]))


def train(n: int = 8, layers: int = 2, dim: int = 32, hidden: int = 64, heads: int = 4):
    """A small ViT on 16-pixel images in 4-pixel patches (the example: 32 px, 512 wide, 6
    layers): ``(loss_fn, model, batch, optimizer)``."""
    patch, size, channels, classes = 4, 16, 3, 10
    # initialised in one compiled program (eqx.filter_jit: the ints are static)
    model = eqx.filter_jit(VisionTransformer)(dim, hidden, heads, layers, 0.1, patch,
                                              (size // patch) ** 2, classes, channels, jr.key(0))
    k1, k2, k3 = jr.split(jr.key(1), 3)
    batch = {"images": jr.normal(k1, (n, channels, size, size)),
             "labels": jr.randint(k2, (n,), 0, classes), "keys": jr.split(k3, n)}
    return loss_fn, model, batch, optax.adamw(1e-4, b1=0.9, b2=0.999)
