"""Keras 3's MobileNetV2 as shipped (JAX backend, ``stateless_call``, training-mode
BatchNormalization): not separable, the batch statistic named, and the mesh — which computes
what data parallelism computes, each shard's own statistics — is not accused of differing from
that when an equivalent one-device computation (one shard at a time) differs as much.

A width multiplier of 0.1 (most layers at MobileNetV2's floor of 8 channels) keeps every layer
and every BatchNormalization of the network, and so what is judged; the layers' shapes then
repeat, so Keras compiles fewer initialiser programs when it builds the model."""
import keras_mobilenet
from mlsys_jax.parallel import comm, ShardOptions, simulate


def test_mobilenet_batchnorm_is_named_and_the_mesh_is_judged_by_the_noise():
    loss_fn, params, batch, optimizer = keras_mobilenet.train(alpha=0.1)
    r = simulate(loss_fn, params, batch, optimizer, {"data": 2}, ShardOptions(
        steps=1, xla_options=comm.FAST_COMPILE, time_repeats=0))
    assert not r.exact and not r.equal_on_this_batch and r.semantics == "per-shard"
    assert "training-mode BatchNorm" in r.reason and "reduce_sum over the batch axis" in r.reason
    assert "mesh computes exactly that" in r.reason
    for q in ("loss", "grads", "params"):
        assert r.bound_ratio[q] <= 1 and r.teacher_forced[q] <= 2 * r.noise[q] + r.bound[q]
