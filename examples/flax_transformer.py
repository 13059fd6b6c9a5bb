"""A small flax linen transformer (pre-LayerNorm blocks of self-attention and an MLP, dropout),
written the way flax code usually is. Example factories as in ``flax_mlp.py``; ``inspect`` takes
a PRNG key for dropout, as training code does (``rngs={"dropout": key}``)."""
from functools import partial

import flax.linen as nn
import jax
import optax


class MlpBlock(nn.Module):
    hidden: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, deterministic=True):
        h = nn.gelu(nn.Dense(self.hidden)(x))
        h = nn.Dropout(self.dropout)(h, deterministic=deterministic)
        return nn.Dense(x.shape[-1])(h)


class Block(nn.Module):
    heads: int
    hidden: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x, deterministic=True):
        h = nn.MultiHeadDotProductAttention(num_heads=self.heads, dropout_rate=self.dropout,
                                            deterministic=deterministic)(nn.LayerNorm()(x))
        x = x + nn.Dropout(self.dropout)(h, deterministic=deterministic)
        return x + MlpBlock(self.hidden, self.dropout)(nn.LayerNorm()(x), deterministic)


class Transformer(nn.Module):
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    hidden: int = 128
    vocab: int = 128
    dropout: float = 0.0

    @nn.compact
    def __call__(self, tokens, deterministic=True):
        x = nn.Embed(self.vocab, self.d_model)(tokens)
        for _ in range(self.layers):
            x = Block(self.heads, self.hidden, self.dropout)(x, deterministic)
        return nn.Dense(self.vocab)(nn.LayerNorm()(x))


@partial(jax.jit, static_argnums=(0, 1, 2))  # one compile per shape, not one per op
def batch_of(n: int, seq: int, vocab: int, seed: int = 1) -> dict:
    """Token ids and next-token labels, a leading batch axis on both."""
    tokens = jax.random.randint(jax.random.key(seed), (n, seq + 1), 0, vocab)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def loss_of(model, dropout_key=None):
    """Mean next-token cross-entropy; with ``dropout_key``, dropout is on (one closed-over key)."""
    def loss_fn(variables, batch):
        rngs = None if dropout_key is None else {"dropout": dropout_key}
        logits = model.apply(variables, batch["tokens"], deterministic=dropout_key is None,
                             rngs=rngs)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return loss_fn


def _setup(layers, n=4, seq=32, dropout=0.0):
    model = Transformer(layers=layers, dropout=dropout)
    batch = batch_of(n, seq, model.vocab)
    return model, jax.jit(model.init)(jax.random.key(0), batch["tokens"]), batch  # one compile


def inspect():
    model, variables, batch = _setup(2, dropout=0.1)

    def forward(variables, tokens, key):
        return model.apply(variables, tokens, deterministic=False, rngs={"dropout": key})
    return forward, (variables, batch["tokens"], jax.random.key(2))


def loss():
    model, variables, batch = _setup(4)
    return loss_of(model), variables, batch


def train():
    model, variables, batch = _setup(2, n=8, seq=16)
    optimizer = optax.chain(optax.clip_by_global_norm(0.1), optax.adamw(1e-3))
    return loss_of(model), variables, batch, optimizer


def train_dropout():
    """Dropout with one key closed over: every shard and every example would share one mask."""
    model, variables, batch = _setup(2, n=8, seq=16, dropout=0.1)
    optimizer = optax.adamw(1e-3)
    return loss_of(model, jax.random.key(3)), variables, batch, optimizer
