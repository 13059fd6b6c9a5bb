"""A GPT-2-shaped flax linen language model, written the way flax code usually is: learned token
and position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU MLP, a final
LayerNorm and the unembedding tied to the token embedding (``nn.Embed.attend``), as GPT-2 does.

``GPT2_SMALL`` is GPT-2 small's shape (12 layers, d_model 768, 12 heads, MLP 3072, vocabulary
50,257, 124 M parameters) at sequence 128 and batch 8. Its factories build it at that size;
the ``*_tiny`` factories build the same code at a size the test suite can afford:

    mlsys-jax inspect examples/flax_gpt2.py:inspect --hw h100      # (f, args)
    mlsys-jax remat examples/flax_gpt2.py:loss --budget 50%       # (loss_fn, params, batch)
    mlsys-jax shard examples/flax_gpt2.py:train --mesh data=4,model=2 --zero 3 --steps 2
"""
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@dataclass(frozen=True)
class Config:
    layers: int
    d_model: int
    heads: int
    vocab: int
    seq: int
    batch: int
    max_positions: int = 1024

    @property
    def hidden(self) -> int:
        return 4 * self.d_model


GPT2_SMALL = Config(layers=12, d_model=768, heads=12, vocab=50257, seq=128, batch=8)
TINY = Config(layers=2, d_model=64, heads=4, vocab=512, seq=32, batch=8, max_positions=64)
# one block, 32 wide: the smallest GPT-2 that still has every kind of layer (tests)
ONE_BLOCK = Config(layers=1, d_model=32, heads=2, vocab=128, seq=16, batch=8, max_positions=16)


class Mlp(nn.Module):
    hidden: int

    @nn.compact
    def __call__(self, x):
        h = nn.gelu(nn.Dense(self.hidden, name="c_fc")(x))
        return nn.Dense(x.shape[-1], name="c_proj")(h)


class Block(nn.Module):
    heads: int
    hidden: int

    @nn.compact
    def __call__(self, x):
        causal = nn.make_causal_mask(jnp.ones(x.shape[:2], bool))
        h = nn.LayerNorm(name="ln_1")(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=self.heads, name="attn")(h, mask=causal)
        return x + Mlp(self.hidden, name="mlp")(nn.LayerNorm(name="ln_2")(x))


class GPT2(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        wte = nn.Embed(c.vocab, c.d_model, name="wte")
        positions = jnp.arange(tokens.shape[1])[None]
        x = wte(tokens) + nn.Embed(c.max_positions, c.d_model, name="wpe")(positions)
        for i in range(c.layers):
            x = Block(c.heads, c.hidden, name=f"h_{i}")(x)
        return wte.attend(nn.LayerNorm(name="ln_f")(x))   # tied unembedding: (batch, seq, vocab)


def batch_of(config: Config, seed: int = 1) -> dict:
    """Token ids and next-token labels, a leading batch axis on both."""
    tokens = jax.random.randint(jax.random.key(seed), (config.batch, config.seq + 1), 0,
                                config.vocab)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def loss_of(model):
    def loss_fn(variables, batch):
        logits = model.apply(variables, batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return loss_fn


def setup(config: Config):
    """The model, its variables (initialised once, under jit) and an example batch."""
    model, batch = GPT2(config), batch_of(config)
    variables = jax.jit(model.init)(jax.random.key(0), batch["tokens"])
    return model, variables, batch


def parameter_count(variables) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(variables))


def inspect(config: Config = GPT2_SMALL):
    """``(f, args)``: the forward pass on the example tokens."""
    model, variables, batch = setup(config)
    return model.apply, (variables, batch["tokens"])


def loss(config: Config = GPT2_SMALL):
    """``(loss_fn, params, batch)``: mean next-token cross-entropy."""
    model, variables, batch = setup(config)
    return loss_of(model), variables, batch


def optimizer():
    """The training factories' optimizer (AdamW)."""
    return optax.adamw(1e-4)


def train(config: Config = GPT2_SMALL):
    """``(loss_fn, params, batch, optimizer)`` with AdamW."""
    return (*loss(config), optimizer())


def inspect_tiny():
    return inspect(TINY)


def loss_tiny():
    return loss(TINY)


def train_tiny():
    return train(TINY)
