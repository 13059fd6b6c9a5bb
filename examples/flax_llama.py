"""A Llama-style flax linen language model, written the way large flax models usually are:
token embeddings, a stack of pre-RMSNorm blocks — grouped-query causal attention with rotary
position embeddings and a SwiGLU MLP — scanned over layers with ``nn.scan`` around ``nn.remat``
(one block's code in the HLO, its parameters stacked on a leading layer axis), a final RMSNorm
and an untied unembedding.

``LLAMA_8B`` is Llama-3-8B's shape (32 layers, d_model 4096, 32 query heads over 8 key/value
heads, MLP 14,336, vocabulary 128,256: 8.03 B parameters) at sequence 2048, batch 64 (one
sequence per device on 64 devices). At that size nothing may be allocated: the ``*_8b``
factories return ``jax.ShapeDtypeStruct`` leaves (``jax.eval_shape`` of the initialiser) and an
abstract batch, for commands that work on shapes.
The ``*_tiny`` factories build the same code with real arrays at a size the test suite affords.

    mlsys-jax inspect examples/flax_llama.py:inspect_tiny --grad
    mlsys-jax shard examples/flax_llama.py:train_tiny --mesh data=4 --zero 3
"""
from dataclasses import dataclass, replace

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax


@dataclass(frozen=True)
class Config:
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    hidden: int
    vocab: int
    seq: int
    batch: int
    rope_theta: float = 500_000.0
    remat_blocks: bool = True       # nn.remat around each block, as large flax models do

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads


LLAMA_8B = Config(layers=32, d_model=4096, heads=32, kv_heads=8, hidden=14336, vocab=128256,
                  seq=2048, batch=64)
LLAMA_8B_NO_REMAT = replace(LLAMA_8B, remat_blocks=False)   # for `remat` to plan
TINY = Config(layers=2, d_model=64, heads=4, kv_heads=2, hidden=128, vocab=256, seq=16, batch=4)
# ~60M parameters, on shapes: the benchmarks' quick tier (the 8B's figures in seconds, not minutes)
SMALL = Config(layers=4, d_model=512, heads=8, kv_heads=4, hidden=1536, vocab=32000, seq=256,
               batch=16)


def parameter_count(c: Config) -> int:
    """The analytic count: embeddings and unembedding, per layer the attention projections, the
    SwiGLU MLP's three matrices and two RMSNorm scales, and the final norm."""
    attention = c.d_model * c.head_dim * (2 * c.heads + 2 * c.kv_heads)  # q, o; k, v
    mlp = 3 * c.d_model * c.hidden
    return 2 * c.vocab * c.d_model + c.layers * (attention + mlp + 2 * c.d_model) + c.d_model


class RMSNorm(nn.Module):
    eps: float = 1e-5

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        ms = jnp.mean(jnp.square(x.astype(jnp.float32)), axis=-1, keepdims=True)
        return (x * jax.lax.rsqrt(ms + self.eps)).astype(x.dtype) * scale


def rotary(x, theta: float):
    """Rotary position embedding on (batch, seq, heads, head_dim), pairs (i, i + head_dim/2)."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = theta ** (-jnp.arange(0, dim // 2, dtype=jnp.float32) * 2 / dim)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None]   # (seq, dim/2)
    cos, sin = jnp.cos(angles)[None, :, None], jnp.sin(angles)[None, :, None]
    a, b = x[..., : dim // 2], x[..., dim // 2:]
    return jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1).astype(x.dtype)


class Attention(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x):
        c = self.config
        dense = lambda heads, name: nn.DenseGeneral((heads, c.head_dim), use_bias=False, name=name)
        q = rotary(dense(c.heads, "q_proj")(x), c.rope_theta)          # (b, s, h, d)
        k = rotary(dense(c.kv_heads, "k_proj")(x), c.rope_theta)       # (b, s, kv, d)
        v = dense(c.kv_heads, "v_proj")(x)
        groups = c.heads // c.kv_heads
        k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
        causal = nn.make_causal_mask(jnp.ones(x.shape[:2], bool))     # (b, 1, s, s)
        out = nn.dot_product_attention(q, k, v, mask=causal)
        return nn.DenseGeneral(c.d_model, axis=(-2, -1), use_bias=False, name="o_proj")(out)


class Block(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, x, _):
        c = self.config
        x = x + Attention(c, name="attn")(RMSNorm(name="attn_norm")(x))
        h = RMSNorm(name="mlp_norm")(x)
        gate = nn.Dense(c.hidden, use_bias=False, name="gate_proj")(h)
        up = nn.Dense(c.hidden, use_bias=False, name="up_proj")(h)
        return x + nn.Dense(c.d_model, use_bias=False, name="down_proj")(nn.silu(gate) * up), None


class Llama(nn.Module):
    config: Config

    @nn.compact
    def __call__(self, tokens):
        c = self.config
        x = nn.Embed(c.vocab, c.d_model, name="embed")(tokens)
        block = nn.remat(Block) if c.remat_blocks else Block
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                        length=c.layers)
        x, _ = stack(c, name="layers")(x, None)
        return nn.Dense(c.vocab, use_bias=False, name="lm_head")(RMSNorm(name="norm")(x))


def loss_of(model):
    def loss_fn(variables, batch):
        logits = model.apply(variables, batch["tokens"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
    return loss_fn


def batch_of(config: Config, seed: int = 1) -> dict:
    """Token ids and next-token labels, a leading batch axis on both."""
    tokens = jax.random.randint(jax.random.key(seed), (config.batch, config.seq + 1), 0,
                                config.vocab)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def abstract_batch(config: Config) -> dict:
    shape = jax.ShapeDtypeStruct((config.batch, config.seq), jnp.int32)
    return {"tokens": shape, "labels": shape}


def setup(config: Config, *, abstract: bool):
    """The model, its variables (ShapeDtypeStructs when ``abstract``) and an example batch."""
    model = Llama(config)
    batch = abstract_batch(config) if abstract else batch_of(config)
    init = jax.eval_shape if abstract else lambda f, *a: jax.jit(f)(*a)
    variables = init(model.init, jax.random.key(0), batch["tokens"])
    return model, variables, batch


def optimizer():
    """The training factories' optimizer (AdamW, float32 state: 8 bytes a parameter)."""
    return optax.adamw(1e-4)


def inspect(config: Config = TINY, *, abstract: bool = False):
    """``(f, args)``: the forward pass on the example tokens."""
    model, variables, batch = setup(config, abstract=abstract)
    return model.apply, (variables, batch["tokens"])


def loss(config: Config = TINY, *, abstract: bool = False):
    """``(loss_fn, params, batch)``: mean next-token cross-entropy."""
    model, variables, batch = setup(config, abstract=abstract)
    return loss_of(model), variables, batch


def train(config: Config = TINY, *, abstract: bool = False):
    """``(loss_fn, params, batch, optimizer)`` with AdamW."""
    return (*loss(config, abstract=abstract), optimizer())


def inspect_tiny():
    return inspect(TINY)


def loss_tiny():
    return loss(TINY)


def train_tiny():
    return train(TINY)


def inspect_8b():
    return inspect(LLAMA_8B, abstract=True)


def loss_8b():
    return loss(LLAMA_8B, abstract=True)


def train_8b():
    return train(LLAMA_8B, abstract=True)


def loss_8b_no_remat():
    """The 8B loss with its blocks not checkpointed: what ``remat`` plans for."""
    return loss(LLAMA_8B_NO_REMAT, abstract=True)


def inspect_small():
    return inspect(SMALL, abstract=True)


def train_small():
    return train(SMALL, abstract=True)


def loss_small_no_remat():
    return loss(replace(SMALL, remat_blocks=False), abstract=True)


def loss_tiny_no_remat():
    return loss(replace(TINY, remat_blocks=False))
