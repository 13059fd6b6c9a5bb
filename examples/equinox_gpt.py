"""A GPT-style decoder in equinox, written the way equinox code usually is: the module is the
parameter pytree, its blocks a Python list (each block its own code in the HLO, unlike a scan),
causal self-attention from ``eqx.nn.MultiheadAttention``, a GELU MLP, pre-LayerNorm, learned
positions and an untied unembedding; the model runs on one sequence and is ``jax.vmap``-ped over
the batch.

``GPT_1B`` is 20 blocks of d_model 2048 (16 heads, MLP 8192) over a 32,000-token vocabulary:
1.14 B parameters, at sequence 1024 and batch 8. Its factories build it on shapes
(``eqx.filter_eval_shape``: ``ShapeDtypeStruct`` leaves, nothing allocated); the ``*_tiny``
factories build the same code with real arrays at a size the test suite affords.

    mlsys-jax inspect examples/equinox_gpt.py:inspect_1b --grad
    mlsys-jax shard examples/equinox_gpt.py:train_1b --mesh data=8 --zero 3
"""
from dataclasses import dataclass

import equinox as eqx
import jax
import jax.numpy as jnp
import optax


@dataclass(frozen=True)
class Config:
    layers: int
    d_model: int
    heads: int
    hidden: int
    vocab: int
    seq: int
    batch: int


GPT_1B = Config(layers=20, d_model=2048, heads=16, hidden=8192, vocab=32000, seq=1024, batch=8)
TINY = Config(layers=2, d_model=32, heads=4, hidden=64, vocab=128, seq=16, batch=8)


def parameter_count(c: Config) -> int:
    """Embeddings (tokens, positions), per block attention (4 d² + 4 d biases), MLP (2 d·h + h +
    d) and two LayerNorms (4 d), the final LayerNorm and the unembedding (d·V + V)."""
    block = 4 * c.d_model ** 2 + 4 * c.d_model + 2 * c.d_model * c.hidden + c.hidden + c.d_model \
        + 4 * c.d_model
    return (c.vocab * c.d_model + c.seq * c.d_model + c.layers * block + 2 * c.d_model
            + c.d_model * c.vocab + c.vocab)


class Block(eqx.Module):
    ln_1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    ln_2: eqx.nn.LayerNorm
    fc: eqx.nn.Linear
    proj: eqx.nn.Linear

    def __init__(self, c: Config, key):
        k1, k2, k3 = jax.random.split(key, 3)
        self.ln_1, self.ln_2 = eqx.nn.LayerNorm(c.d_model), eqx.nn.LayerNorm(c.d_model)
        self.attn = eqx.nn.MultiheadAttention(c.heads, c.d_model, use_query_bias=True,
                                              use_key_bias=True, use_value_bias=True,
                                              use_output_bias=True, key=k1)
        self.fc = eqx.nn.Linear(c.d_model, c.hidden, key=k2)
        self.proj = eqx.nn.Linear(c.hidden, c.d_model, key=k3)

    def __call__(self, x):                                    # (seq, d_model)
        h = jax.vmap(self.ln_1)(x)
        causal = jnp.tril(jnp.ones((x.shape[0], x.shape[0]), bool))
        x = x + self.attn(h, h, h, mask=causal)
        h = jax.nn.gelu(jax.vmap(self.fc)(jax.vmap(self.ln_2)(x)))
        return x + jax.vmap(self.proj)(h)


class GPT(eqx.Module):
    tokens: eqx.nn.Embedding
    positions: eqx.nn.Embedding
    blocks: list
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, c: Config, key):
        k_tok, k_pos, k_head, *k_blocks = jax.random.split(key, 3 + c.layers)
        self.tokens = eqx.nn.Embedding(c.vocab, c.d_model, key=k_tok)
        self.positions = eqx.nn.Embedding(c.seq, c.d_model, key=k_pos)
        self.blocks = [Block(c, k) for k in k_blocks]
        self.ln_f = eqx.nn.LayerNorm(c.d_model)
        self.head = eqx.nn.Linear(c.d_model, c.vocab, key=k_head)

    def __call__(self, tokens):                               # (seq,) -> (seq, vocab)
        x = jax.vmap(self.tokens)(tokens) + jax.vmap(self.positions)(jnp.arange(tokens.shape[0]))
        for block in self.blocks:
            x = block(x)
        return jax.vmap(self.head)(jax.vmap(self.ln_f)(x))


def loss_fn(model, batch):
    logits = jax.vmap(model)(batch["tokens"])
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()


def setup(c: Config, *, abstract: bool):
    """The model (ShapeDtypeStruct leaves when ``abstract``) and an example batch."""
    if abstract:
        model = eqx.filter_eval_shape(GPT, c, jax.random.key(0))
        tokens = jax.ShapeDtypeStruct((c.batch, c.seq), jnp.int32)
        return model, {"tokens": tokens, "labels": tokens}
    model = GPT(c, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (c.batch, c.seq + 1), 0, c.vocab)
    return model, {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def inspect(c: Config = TINY, *, abstract: bool = False):
    """``(f, args)``: the forward pass over the batch."""
    model, batch = setup(c, abstract=abstract)
    return (lambda m, t: jax.vmap(m)(t)), (model, batch["tokens"])


def loss(c: Config = TINY, *, abstract: bool = False):
    """``(loss_fn, params, batch)``: mean next-token cross-entropy."""
    return (loss_fn, *setup(c, abstract=abstract))


def train(c: Config = TINY, *, abstract: bool = False):
    """``(loss_fn, params, batch, optimizer)`` with AdamW."""
    return (*loss(c, abstract=abstract), optax.adamw(1e-4))


def inspect_tiny():
    return inspect(TINY)


def loss_tiny():
    return loss(TINY)


def train_tiny():
    return train(TINY)


def inspect_1b():
    return inspect(GPT_1B, abstract=True)


def loss_1b():
    return loss(GPT_1B, abstract=True)


def train_1b():
    return train(GPT_1B, abstract=True)
