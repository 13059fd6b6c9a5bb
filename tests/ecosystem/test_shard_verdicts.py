"""Separability verdicts on models nobody here wrote: from the dataflow, confirmed on gradients.

Each loss is judged once per module (``separability_of``: whole-batch against per-shard
gradients at four points, the mixing equations named), with every program compiled alike.
"""
import numpy as np
import pytest

import centred_inputs
import equinox_vit
import flax_batchnorm
import flax_lm1b
import haiku_nets
from mlsys_jax.parallel import comm
from mlsys_jax.parallel.shard import separability_of

FACTORIES = {"haiku_resnet": haiku_nets.train_resnet, "flax_zero_head": flax_batchnorm.train_zero_head,
             "centred": centred_inputs.train, "lm1b": flax_lm1b.train,
             "lm1b_padded": flax_lm1b.train_padded, "vit": equinox_vit.train}
_VERDICTS = {}


def verdict(name, data=4):
    if (name, data) not in _VERDICTS:
        loss_fn, params, batch, *_ = FACTORIES[name]()
        _VERDICTS[(name, data)] = separability_of(loss_fn, params, batch, data,
                                                  options=comm.QUICK_COMPILE)
    return _VERDICTS[(name, data)]


@pytest.mark.parametrize("name, module", [("haiku_resnet", "batchnorm"),
                                          ("flax_zero_head", "BatchNorm_0"),
                                          ("centred", "centred_inputs.py")])
def test_equal_losses_at_init_but_different_gradients_are_not_separable(name, module):
    """Zero-initialised heads (haiku's ResNet logits, a Dense with zero kernel) and zero weights
    on batch-centred inputs: the loss is the same whole-batch and per shard at the initial
    parameters, the gradients are not; the mixing equation is named."""
    sep = verdict(name)
    assert not sep.separable and not sep.equal_here
    assert abs(sep.whole - sep.shards_mean) <= 1e-5 * abs(sep.whole)     # the trap
    assert sep.grads.diff > 100 * max(sep.grads.noise, 1e-7)           # the evidence
    stats = [m for m in sep.mixing if m.kind == "statistic"]
    assert stats and stats[0].primitive == "reduce_sum" and module in stats[0].describe()
    assert "batch statistic" in sep.causes[0] and "reduce_sum over the batch axis" in sep.causes[0]
    assert module in sep.causes[0]


def _counts(name, data=2):
    """Non-padding tokens per shard and in the batch, counted here from the example batch."""
    inputs = np.asarray(FACTORIES[name]()[2]["inputs"])
    shards = np.split(inputs > 0, data)
    return [int(s.sum()) for s in shards], int((inputs > 0).sum())


def test_lm1b_without_padding_is_equal_on_this_batch_and_says_why():
    sep = verdict("lm1b", 2)
    assert not sep.separable and sep.equal_here
    assert [m.kind for m in sep.mixing] == ["normaliser"]
    assert "the count of entries with batch['inputs'] > 0" in sep.causes[0]
    shards, whole = _counts("lm1b")
    assert len(set(shards)) == 1
    assert "every shard holds the same value" in sep.why_equal
    assert f"{shards[0]} of the batch's {whole}" in sep.why_equal


def test_lm1b_with_padding_is_not_separable_and_names_the_counts():
    sep = verdict("lm1b_padded", 2)
    assert not sep.separable and not sep.equal_here
    assert "the count of entries with batch['inputs'] > 0" in sep.causes[0]
    shards, whole = _counts("lm1b_padded")
    assert len(set(shards)) > 1
    assert f"{', '.join(map(str, shards))} in the shards, {whole} in the batch" in sep.causes[0]


def test_per_example_dropout_keys_in_the_batch_are_separable():
    """equinox's ViT example vmaps the model with one dropout key per example: separable."""
    sep = verdict("vit", 2)
    assert sep.separable and not sep.mixing and sep.grads.within
