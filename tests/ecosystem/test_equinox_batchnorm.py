"""equinox's ``eqx.nn.BatchNorm`` in training mode, vmapped with ``axis_name="batch"`` as its docs
say: under ``vmap`` its ``pmean`` becomes ``psum`` over array dimension 0, the batch. The walk
names that statistic (it had said it could not follow the psum, then that "no equation mixes
examples" beside it); shard's NO names the BatchNorm and its psum, consistently."""
import equinox as eqx
import jax
import optax
import pytest

from mlsys_jax.parallel import ShardOptions, comm, simulate
from mlsys_jax.parallel.shard.batch.rules import follow_batch


class Net(eqx.Module):
    l1: eqx.nn.Linear
    bn: eqx.nn.BatchNorm
    l2: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.l1 = eqx.nn.Linear(8, 16, key=k1)
        self.bn = eqx.nn.BatchNorm(16, axis_name="batch", mode="batch")
        self.l2 = eqx.nn.Linear(16, 4, key=k2)

    def __call__(self, x, state):
        h, state = self.bn(jax.nn.relu(self.l1(x)), state)
        return self.l2(h), state


def _train():
    model, state = eqx.nn.make_with_state(Net)(jax.random.key(0))
    kx, ky = jax.random.split(jax.random.key(1))
    batch = {"x": jax.random.normal(kx, (16, 8)), "y": jax.random.randint(ky, (16,), 0, 4)}

    def loss_fn(model, batch):
        logits, _ = jax.vmap(model, axis_name="batch", in_axes=(0, None),
                             out_axes=(0, None))(batch["x"], state)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn, model, batch, optax.sgd(0.1)


@pytest.mark.slow
def test_the_walk_names_batchnorms_psum_as_the_statistic():
    loss_fn, model, batch, _ = _train()
    params, static = eqx.partition(model, eqx.is_array)
    closed = jax.make_jaxpr(lambda p, b: loss_fn(eqx.combine(p, static), b))(params, batch)
    invars = set(closed.jaxpr.invars[len(jax.tree.leaves(params)):])
    w = follow_batch(closed, invars, 16)
    assert [(m.kind, m.primitive) for m in w.mixing] == [("statistic", "psum")]
    assert "BatchNorm" in w.mixing[0].where


@pytest.mark.slow
def test_shard_says_no_and_names_the_batchnorm():
    loss_fn, model, batch, optimizer = _train()
    r = simulate(loss_fn, model, batch, optimizer, {"data": 2}, ShardOptions(
        steps=1, xla_options=comm.FAST_COMPILE, time_repeats=0))
    assert not r.exact and "training-mode BatchNorm" in r.reason
    assert "psum over the batch axis" in r.reason
    assert "no equation mixes" not in r.reason and "could not follow" not in r.reason
