"""Separability verdicts on models nobody here wrote: from the dataflow, confirmed on gradients.

Each loss is judged once per module (``separability_of``: whole-batch against per-shard
gradients at four points, the mixing equations named), with every program compiled alike. The
verdicts of flax's lm1b (with and without padding) and equinox's ViT are in
``test_shard_models.py``, beside those models' runs on a mesh (built once, their programs
compiled once).
"""
import pytest

import centred_inputs
import flax_batchnorm
import haiku_nets
from mlsys_jax.parallel import comm
from mlsys_jax.parallel.shard import separability_of
from tests.ecosystem.init_bits import init_bits

FACTORIES = {"haiku_resnet": haiku_nets.train_resnet, "flax_zero_head": flax_batchnorm.train_zero_head,
             "centred": centred_inputs.train}
_VERDICTS = {}


def verdict(name, data=4):
    """The factory's verdict (the model built under ``init_bits``: the verdicts hold whichever
    values its parameters draw)."""
    if (name, data) not in _VERDICTS:
        with init_bits():
            loss_fn, params, batch, *_ = FACTORIES[name]()
        _VERDICTS[(name, data)] = separability_of(loss_fn, params, batch, data,
                                                  options=comm.FAST_COMPILE)
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
