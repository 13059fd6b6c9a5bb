"""The sharded step of the global semantics compiles while the one-device programs run, where
the semantics can be global, and the run takes that executable; where the dataflow shows examples
mixed (a batch statistic), or a verdict of not separable is given, nothing is compiled ahead."""
import importlib

import jax.numpy as jnp
import optax
import pytest

from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import comm, ShardOptions, simulate
from mlsys_jax.parallel.lecture import data
from mlsys_jax.parallel.shard import step
from mlsys_jax.parallel.shard.setup import prepare

simulate_module = importlib.import_module("mlsys_jax.parallel.shard.simulate")


def separable_loss(params, batch):
    return mlp_loss(params, batch["x"], batch["y"])


def normalised_loss(params, batch):   # each example scaled by a statistic of the whole batch
    x = batch["x"] / jnp.mean(jnp.abs(batch["x"]))
    return mlp_loss(params, x, batch["y"])


def _problem():
    params, x, y = data.demo_problem(0, 16, (8, 16, 4))
    return params, {"x": x, "y": y}, optax.sgd(0.1)


def test_a_separable_loss_runs_the_step_compiled_ahead(monkeypatch):
    params, batch, opt = _problem()
    taken = []
    compile_sharded = step.compile_sharded

    def spy(*args, ahead=None, **kwargs):
        taken.append(ahead is not None)
        return compile_sharded(*args, ahead=ahead, **kwargs)
    monkeypatch.setattr(step, "compile_sharded", spy)
    r = simulate(separable_loss, params, batch, opt, {"data": 2}, ShardOptions(
        steps=1, xla_options=comm.QUICK_COMPILE))
    assert r.exact and r.semantics == "global" and taken == [True]


def test_nothing_is_compiled_ahead_where_the_semantics_cannot_be_global():
    params, batch, opt = _problem()
    mixed = prepare(normalised_loss, params, batch, opt, {"data": 2})
    assert simulate_module._mesh_ahead(mixed, ShardOptions()) is None
    plain = prepare(separable_loss, params, batch, opt, {"data": 2})
    assert simulate_module._mesh_ahead(plain, ShardOptions(separable=False)) is None
    ahead = simulate_module._mesh_ahead(plain, ShardOptions())
    assert ahead.future.result().memory_analysis() is not None and ahead.jaxpr.eqns


def test_a_step_compiled_ahead_is_taken_for_that_step_only():
    """compile_sharded refuses an ahead compiled for other arguments (its executable would
    silently run another step) and takes it for the very step."""
    params, batch, opt = _problem()
    setup = prepare(separable_loss, params, batch, opt, {"data": 2})
    ahead = step.compile_ahead(setup, setup.loss, comm.QUICK_COMPILE, donate=True)
    with pytest.raises(ValueError, match="compiled for another"):
        step.compile_sharded(setup, setup.loss, comm.QUICK_COMPILE, donate=False, ahead=ahead)
    with pytest.raises(ValueError, match="compiled for another"):
        step.compile_sharded(setup, lambda *a: setup.loss(*a), comm.QUICK_COMPILE, donate=True,
                             ahead=ahead)
    traced: list = []
    got = step.compile_sharded(setup, setup.loss, comm.QUICK_COMPILE, donate=True,
                               traced=traced, ahead=ahead)
    assert got is ahead.future.result() and traced == [ahead.jaxpr]
