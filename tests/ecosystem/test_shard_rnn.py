"""``mlsys-jax shard --mesh data=2`` on recurrent models as their libraries ship them (flax linen
``nn.RNN(nn.LSTMCell)``, a bidirectional GRU, a time-major ``nn.RNN``, ``nnx.RNN``, equinox's
``LSTMCell`` in ``lax.scan``): a scan over time from a zero state is separable, so exact.
(diffrax and keras-hub are not installed here.)"""
import json
import os

import optax
import pytest

from tests.ecosystem import rnn_factories
from mlsys_jax import cli
from mlsys_jax.parallel.shard.setup import prepare

FACTORIES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rnn_factories.py")


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["flax_lstm", "flax_bigru", "flax_lstm_time_major", "nnx_rnn",
                                "eqx_lstm"])
def test_recurrent_models_are_exact(capsys, fn):
    code = cli.main(["shard", f"{FACTORIES}:{fn}", "--mesh", "data=2", "--quick-compile",
                     "--json", "--steps", "2"])
    got = json.loads(capsys.readouterr().out)
    assert code == 0 and got["exact"] is True, got["reason"]
    assert "separable loss" in got["reason"]


def test_a_time_major_batch_holds_its_examples_on_axis_1():
    loss_fn, params, batch, _ = rnn_factories.flax_lstm_time_major()
    setup = prepare(loss_fn, params, batch, optax.sgd(0.0), {"data": 2})
    assert setup.batch_axes == (1, 1)
    loss_fn, params, batch, _ = rnn_factories.flax_lstm()
    assert prepare(loss_fn, params, batch, optax.sgd(0.0), {"data": 2}).batch_axes == (0, 0)
