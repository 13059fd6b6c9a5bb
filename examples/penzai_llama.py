"""A tiny Llama-like transformer built by penzai's own builder
(``penzai.models.transformer.variants.llamalike_common.build_llamalike_transformer``: RMSNorm,
rotary embeddings, SwiGLU MLPs, no biases, named axes throughout) and trained the way penzai's
``toolshed.basic_training`` does: ``pz.unbind_params(model, freeze=True)`` gives the parameter
values, the loss binds them back (``pz.bind_variables``) and scores next-token log-probabilities
on named arrays.

    mlsys-jax shard examples/penzai_llama.py:train --mesh data=2,model=2
"""
import jax
import jax.numpy as jnp
import optax
from penzai import pz
from penzai.models.transformer.variants import llamalike_common


def build(init_base_rng, layers: int = 2, embedding: int = 32, heads: int = 4, hidden: int = 64,
          vocab: int = 64):
    """The model; with ``init_base_rng=None`` penzai leaves parameter slots unfilled (the
    stateless model ``pz.unbind_params`` would give)."""
    config = llamalike_common.LlamalikeTransformerConfig(
        num_kv_heads=heads, query_head_multiplier=1, embedding_dim=embedding,
        projection_dim=embedding // heads, mlp_hidden_dim=hidden, num_decoder_blocks=layers,
        vocab_size=vocab, mlp_variant="swiglu", tie_embedder_and_logits=False)
    return llamalike_common.build_llamalike_transformer(config, init_base_rng=init_base_rng)


def loss_of(stateless_model):
    def loss_fn(params, batch):
        model = pz.bind_variables(stateless_model, params)
        tokens = pz.nx.wrap(batch["tokens"]).tag("batch", "seq")
        logits = model(tokens)
        log_probs = pz.nx.nmap(jax.nn.log_softmax)(
            logits[{"seq": pz.slice[:-1]}].untag("vocabulary")).tag("vocabulary")
        targets = tokens[{"seq": pz.slice[1:]}]
        losses = -log_probs[{"vocabulary": targets}]
        return jnp.mean(losses.unwrap("batch", "seq"))
    return loss_fn


def train(n: int = 8, seq: int = 16):
    """``(loss_fn, parameter values, batch, optimizer)``; the parameters initialised in one
    compiled program (penzai's initialisers are pure functions of the base key)."""
    stateless_model = build(None)
    params = jax.jit(lambda key: pz.unbind_params(build(key), freeze=True)[1])(jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (n, seq), 0, 64)
    return loss_of(stateless_model), params, {"tokens": tokens}, optax.adamw(1e-3)
