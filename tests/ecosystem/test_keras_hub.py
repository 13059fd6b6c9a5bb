"""keras-hub backbones as shipped (JAX backend, ``stateless_call``), at tiny sizes: Gemma's causal
mask, built with ``where`` on ``arange`` comparisons, is per example, so ``shard --mesh data=2``
says exact: yes; Bert in training mode draws dropout masks from a Keras SeedGenerator closed over,
and the NO names that dropout — not the position-embedding add before it — and the shards fold
their index into the key. The module's factories are the CLI's target (``FILE.py:gemma``)."""
import json
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import keras  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

# Not an extra (its requirements pull in TensorFlow): .ci/run installs it, the README says how.
keras_hub = pytest.importorskip("keras_hub", reason="keras-hub is not installed (README, Install)")

from mlsys_jax import cli  # noqa: E402
from mlsys_jax.parallel import ShardOptions, comm, simulate  # noqa: E402
from mlsys_jax.parallel.shard.batch.rules import follow_batch  # noqa: E402

ROWS, SEQ, VOCAB = 8, 8, 64


def _backbone(kind: str):
    """One block each: the embeddings, the masks and the dropout the tests read are all in the
    first block, and every further block is more to compile, not more to check."""
    keras.utils.set_random_seed(0)
    if kind == "gemma":
        return keras_hub.models.GemmaBackbone(
            vocabulary_size=VOCAB, num_layers=1, num_query_heads=2, num_key_value_heads=1,
            hidden_dim=32, intermediate_dim=64, head_dim=16)
    return keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=1, num_heads=2,
                                         hidden_dim=32, intermediate_dim=64,
                                         max_sequence_length=16)


def _train(kind: str, *, training: bool = False, padded: bool = False):
    """``(loss_fn, trainable variables, batch, optimizer)``: the mean square of the backbone's
    sequence output, the non-trainable variables (Bert's dropout seeds) closed over."""
    model = _backbone(kind)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    ids = jax.random.randint(jax.random.key(1), (ROWS, SEQ), 0, VOCAB)
    lengths = SEQ - jnp.arange(ROWS)[:, None] % 3 if padded else SEQ
    batch = {"token_ids": ids,
             "padding_mask": (jnp.arange(SEQ)[None] < lengths).astype("int32")
             * jnp.ones((ROWS, SEQ), "int32")}
    if kind == "bert":
        batch["segment_ids"] = jnp.zeros((ROWS, SEQ), "int32")

    def loss_fn(trainable, batch):
        out, _ = model.stateless_call(trainable, frozen, batch, training=training)
        out = out["sequence_output"] if isinstance(out, dict) else out
        return jnp.mean(out.astype(jnp.float32) ** 2)
    return loss_fn, trainable, batch, optax.sgd(1e-2)


def gemma():
    return _train("gemma")


def _walk(loss_fn, trainable, batch):
    closed = jax.make_jaxpr(loss_fn)(trainable, batch)
    invars = set(closed.jaxpr.invars[len(jax.tree.leaves(trainable)):])
    return follow_batch(closed, invars, ROWS)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gemma", "bert"])
def test_padded_backbones_mix_no_examples(kind):
    """Padding that differs per row, the causal mask and the position embeddings: no record."""
    loss_fn, trainable, batch, _ = _train(kind, padded=True)
    w = _walk(loss_fn, trainable, batch)
    assert w.mixing == [] and type(w.output).__name__ == "Summed"


@pytest.mark.slow
def test_gemma_on_a_data_mesh_is_exact(capsys):
    code = cli.main(["--devices", "8", "shard", f"{os.path.abspath(__file__)}:gemma", "--mesh",
                     "data=2", "--steps", "1", "--quick-compile", "--json"])
    got = json.loads(capsys.readouterr().out)
    assert code == 0 and got["exact"] is True and "separable loss" in got["reason"]


@pytest.mark.slow
def test_bert_dropout_is_the_named_cause_and_shards_fold_the_key():
    loss_fn, trainable, batch, optimizer = _train("bert", training=True)
    w = _walk(loss_fn, trainable, batch)
    first = w.mixing[0]
    assert (first.kind, first.primitive, first.random) == ("position", "select_n", True)
    assert "dropout" in first.where and "position_embedding" not in first.where
    r = simulate(loss_fn, trainable, batch, optimizer, {"data": 2}, ShardOptions(
        steps=1, xla_options=comm.FAST_COMPILE, time_repeats=0))
    assert not r.exact and "dropout" in r.reason and "position_embedding" not in r.reason
    assert "each shard folds its index into the key" in r.reason
    assert "mesh computes exactly that" in r.reason
