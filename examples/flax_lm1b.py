"""A decoder-only language model written after flax's ``examples/lm1b`` (``models.py`` and
``train.py``; read there, not copied): every parameter is boxed by ``nn.with_logical_partitioning``
with the example's logical names (``embed``, ``mlp``, ``vocab``, ``kv``), the example's logical
axis rules (``configs/default.py``: ``mlp``, ``vocab`` and ``heads`` on the ``tensor`` mesh axis,
``embed`` on ``fsdp``), a padding-and-causal attention mask from ``inputs > 0``, inputs shifted
right, and the loss of its ``train_step``: the token cross-entropy summed with padding weights
``inputs > 0`` and divided by the batch's count of non-padding tokens (``weights.sum()``).

The factories return ``(loss_fn, variables, batch, optimizer, rules)``; ``variables`` keep the
``nn.Partitioned`` boxes, as ``model.init`` returns them:

    mlsys-jax shard examples/flax_lm1b.py:train --mesh data=2,model=2
    mlsys-jax shard examples/flax_lm1b.py:train_padded --mesh data=2
"""
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

# The example's rules (configs/default.py) over its mesh axes data, fsdp and tensor.
RULES = [("mlp", "tensor"), ("vocab", "tensor"), ("embed", "fsdp"), ("heads", "tensor")]


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    emb_dim: int = 32
    heads: int = 4
    layers: int = 2
    qkv_dim: int = 32
    mlp_dim: int = 64
    max_len: int = 32


def _boxed(init, names):
    return nn.with_logical_partitioning(init, names)


def _layer_norm(name=None):
    return nn.LayerNorm(name=name, bias_init=_boxed(nn.initializers.zeros, ("embed",)),
                        scale_init=_boxed(nn.initializers.ones, ("embed",)))


def _sinusoids(max_len: int, features: int) -> np.ndarray:
    """The fixed (not learned) position table, shape (1, max_len, features)."""
    position = np.arange(max_len)[:, None]
    scale = -np.log(10000.0) / (features // 2 - 1)
    rates = np.exp(np.arange(features // 2) * scale)
    table = np.zeros((max_len, features), np.float32)
    table[:, : features // 2] = np.sin(position * rates)
    table[:, features // 2: 2 * (features // 2)] = np.cos(position * rates)
    return table[None]


class Mlp(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x):
        c, kernel = self.config, nn.initializers.xavier_uniform()
        bias = nn.initializers.normal(stddev=1e-6)
        h = nn.Dense(c.mlp_dim, kernel_init=_boxed(kernel, ("embed", "mlp")),
                     bias_init=_boxed(bias, ("mlp",)))(x)
        return nn.Dense(x.shape[-1], kernel_init=_boxed(kernel, ("mlp", "embed")),
                        bias_init=_boxed(bias, ("embed",)))(nn.relu(h))


class DecoderBlock(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, mask):
        c = self.config
        h = nn.MultiHeadDotProductAttention(
            num_heads=c.heads, qkv_features=c.qkv_dim, use_bias=False, broadcast_dropout=False,
            kernel_init=_boxed(nn.initializers.xavier_uniform(), ("embed", "kv")),
            deterministic=True)(_layer_norm()(x), mask=mask)
        x = x + h
        return x + Mlp(c)(_layer_norm()(x))


class TransformerLM(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, inputs):
        c = self.config
        mask = nn.combine_masks(nn.make_attention_mask(inputs > 0, inputs > 0),
                                nn.make_causal_mask(inputs))
        shifted = jnp.pad(inputs, ((0, 0), (1, 0)))[:, :-1]   # shift right: predict token t
        embed = nn.Embed(c.vocab, c.emb_dim, embedding_init=_boxed(
            nn.initializers.normal(stddev=1.0), ("vocab", "embed")))
        y = embed(shifted) + _sinusoids(c.max_len, c.emb_dim)[:, : inputs.shape[1]]
        for i in range(c.layers):
            y = DecoderBlock(c, name=f"encoderdecoderblock_{i}")(y, mask)
        y = _layer_norm("encoderdecoder_norm")(y)
        return nn.Dense(c.vocab, name="logitdense",
                        kernel_init=_boxed(nn.initializers.xavier_uniform(), ("embed", "vocab")),
                        bias_init=_boxed(nn.initializers.normal(stddev=1e-6), ("vocab",)))(y)


def loss_of(model):
    """The example's training loss: padding-weighted cross-entropy over the non-padding count."""
    def loss_fn(variables, batch):
        inputs = batch["inputs"]
        weights = jnp.where(inputs > 0, 1, 0).astype(jnp.float32)
        logits = model.apply(variables, inputs)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, inputs) * weights
        return loss.sum() / weights.sum()
    return loss_fn


def batch_of(config: Config, n: int, seq: int, padded: bool, seed: int = 1) -> dict:
    """Token ids in 1..vocab-1; with ``padded``, row i ends in i+1 padding zeros (lengths differ
    from row to row, as the example's unpacked batches do)."""
    tokens = np.array(jax.random.randint(jax.random.key(seed), (n, seq), 1, config.vocab))
    if padded:
        for i in range(n):
            tokens[i, seq - 1 - i % (seq - 1):] = 0
    return {"inputs": jnp.asarray(tokens)}


def _train(padded: bool, n: int = 8, seq: int = 16, config: Config = Config()):
    model = TransformerLM(config)
    batch = batch_of(config, n, seq, padded)
    variables = jax.jit(model.init)(jax.random.key(0), batch["inputs"])
    optimizer = optax.adamw(1e-3, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.1)
    return loss_of(model), variables, batch, optimizer, RULES


def train():
    """A batch without padding: the loss' denominator is the same for every shard here."""
    return _train(padded=False)


def train_padded():
    """A batch whose rows hold different amounts of padding."""
    return _train(padded=True)
