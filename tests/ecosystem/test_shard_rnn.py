"""``mlsys-jax shard --mesh data=2``'s step (``parallel.shard.simulate``, what the command runs)
on recurrent models as their libraries ship them (flax linen ``nn.RNN`` of an ``nn.LSTMCell``
and of an ``nn.GRUCell`` in ``nn.Bidirectional``, a time-major ``nn.RNN``, ``nnx.RNN``, equinox's
``LSTMCell`` in ``lax.scan``): a scan over time from a zero state is separable, so exact.
(The command's own loading and JSON are tests/ecosystem/test_cli_shard.py's; keras-hub's and
diffrax's scans and masks, test_keras_hub.py's and test_diffrax.py's.)"""
import optax
import pytest

from tests.ecosystem import rnn_factories
from mlsys_jax.parallel.comm import FAST_COMPILE
from mlsys_jax.parallel.shard import ShardOptions, simulate
from mlsys_jax.parallel.shard.setup import prepare


@pytest.mark.slow
@pytest.mark.parametrize("fn", ["flax_bidirectional", "flax_lstm_time_major", "nnx_rnn",
                                "eqx_lstm"])
def test_recurrent_models_are_exact(fn):
    loss_fn, params, batch, optimizer = getattr(rnn_factories, fn)()
    report = simulate(loss_fn, params, batch, optimizer, {"data": 2},
                      ShardOptions(steps=2, xla_options=FAST_COMPILE))
    assert report.exact is True, report.reason
    assert "separable loss" in report.reason


def test_a_time_major_batch_holds_its_examples_on_axis_1():
    loss_fn, params, batch, _ = rnn_factories.flax_lstm_time_major()
    setup = prepare(loss_fn, params, batch, optax.sgd(0.0), {"data": 2})
    assert setup.batch_axes == (1, 1)
    loss_fn, params, batch, _ = rnn_factories.flax_lstm()
    assert prepare(loss_fn, params, batch, optax.sgd(0.0), {"data": 2}).batch_axes == (0, 0)
