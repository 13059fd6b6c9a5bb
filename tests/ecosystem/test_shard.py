"""Users' flax/equinox training steps on a simulated mesh (``parallel.simulate``), in float32.

Compiled runs are cached per module: each (model, mesh, stage) compiles once, and the one-device
reference once per model. Each run takes 2 steps: teacher-forced from one device's states, then
free-running, where the second step starts from the mesh's own state.
"""
import re

import jax
import numpy as np
import optax
import pytest

import equinox_mlp
import flax_batchnorm
import flax_mlp
import flax_transformer
from mlsys_jax.parallel import comm, megatron_rules, ShardOptions, simulate
from mlsys_jax.parallel.shard.partition_rules import array_paths
from mlsys_jax.parallel.shard.run import Recorder

MODELS = {"flax_mlp": flax_mlp.train, "equinox_mlp": equinox_mlp.train,
          "flax_transformer": flax_transformer.train, "flax_batchnorm": flax_batchnorm.train,
          "flax_mlp_dropout": flax_mlp.train_dropout}
_FACTORIES, _CACHES, _REPORTS = {}, {}, {}


def built(model):
    """The factory's ``(loss_fn, params, batch, optimizer)``, built once per module."""
    if model not in _FACTORIES:
        _FACTORIES[model] = MODELS[model]()
    return _FACTORIES[model]


def run(model, mesh, zero=0, rules=None):
    key = (model, tuple(mesh.items()), zero, rules is not None)
    if key not in _REPORTS:
        loss_fn, params, batch, optimizer = built(model)
        given = None if rules is None else rules(params)
        _REPORTS[key] = simulate(loss_fn, params, batch, optimizer, mesh, ShardOptions(
            zero=zero, steps=2, xla_options=comm.QUICK_COMPILE, time_repeats=0), rules=given,
            cache=_CACHES.setdefault(model, {}))
    return _REPORTS[key]


def relative(report, quantity, which="teacher_forced"):
    return getattr(report, which)[quantity] / report.magnitude[quantity]


# Every stage on one model; the other models at the first stage and the last (whose layout
# splits the most: parameters, gradients and optimizer state).
ZERO_CASES = [("flax_mlp", z) for z in range(4)] + [("equinox_mlp", 3), ("flax_transformer", 0),
                                                     ("flax_transformer", 3)]


@pytest.mark.parametrize("model, zero", ZERO_CASES)
def test_zero_stages_are_exact_with_global_norm_clipping(model, zero):
    """chain(clip_by_global_norm(0.1), adamw) on data=4: the clip stays global at every stage."""
    r = run(model, {"data": 4}, zero)
    assert r.exact, r.reason
    assert relative(r, "params") <= 1e-6  # the optimizer on the mesh = on one device
    assert relative(r, "grads") <= 1e-6 and relative(r, "loss") <= 1e-6
    if model != "flax_transformer":  # free-running too (the transformer: next test)
        assert relative(r, "params", "max_abs_diff") <= 1e-6
    assert all(c["ratio"] == pytest.approx(1.0) for c in r.collectives if c["formula_bytes"])
    measured, expected = r.per_device_bytes["measured"], r.per_device_bytes["expected"]
    assert measured["arguments"] == expected["arguments"]
    assert measured["outputs"] == expected["outputs"]


def test_transformer_free_running_drift_is_adam_on_rounding_noise():
    """After 2 free-running steps the transformer's params differ by more than 1e-6 relative;
    one device with the batch rows reversed (the same sums in another order) drifts as far:
    Adam divides the rounding noise of gradients that are mathematically zero (attention key
    biases) by its own magnitude. The one-device step is one compiled program (gradient, then
    update) whose first call also gives the gradients at the initial parameters."""
    r = run("flax_transformer", {"data": 4}, 0)
    loss_fn, params, batch, opt = built("flax_transformer")

    def step(t, s, b):
        g = jax.grad(loss_fn)(t, b)
        u, s = opt.update(g, s, t)
        return optax.apply_updates(t, u), s, g

    s0 = jax.jit(opt.init)(params)
    step = jax.jit(step).lower(params, s0, batch).compile(comm.QUICK_COMPILE)
    reversed_batch = jax.tree.map(lambda x: x[::-1], batch)
    (t, s), (u, v) = (params, s0), (params, s0)
    for k in range(2):
        t, s, g = step(t, s, batch)
        u, v, _ = step(u, v, reversed_batch)
        if k == 0:
            grads = dict(array_paths(g))   # at the initial parameters
    drift = {p: float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for (p, x), (_, y) in
             zip(array_paths(t), array_paths(u))}
    assert max(drift.values()) >= r.max_abs_diff["params"] / 10
    worst = max(drift, key=drift.get)
    assert "['key']['bias']" in worst
    assert float(np.max(np.abs(grads[worst]))) < 1e-7  # zero up to rounding


def test_transformer_megatron_rules():
    mesh = {"data": 2, "model": 4}  # both axes, and a model axis wider than 2
    r = run("flax_transformer", mesh, 0, rules=lambda p: megatron_rules(p, size=mesh["model"]))
    assert r.exact, r.reason
    assert r.forward_all_reduces == {"measured": 4, "megatron": 4}  # 2 per layer, 2 layers
    model_axis = [c for c in r.collectives if c["axis"] == "model"]
    assert model_axis and all(c["ratio"] == pytest.approx(1.0) for c in model_axis)
    # per-device parameter bytes: replicated leaves whole, split weights 1/M
    nbytes = {p: x.size * 4 for p, x in array_paths(built("flax_transformer")[1])}
    spec = {p: next((s for rx, s in r.rules if re.search(rx, p)), "") for p in nbytes}
    split = sum(b for p, b in nbytes.items() if "model" in spec[p])
    assert split > sum(nbytes.values()) / 2
    whole = sum(nbytes.values()) - split
    assert r.per_device_bytes["layout"]["params"] == whole + split // mesh["model"]
    assert r.per_device_bytes["measured"]["arguments"] == r.per_device_bytes["expected"]["arguments"]


@pytest.mark.parametrize("data", [4, 8])
def test_zero3_parameter_and_optimizer_bytes_within_5_percent(data):
    r = run("flax_mlp", {"data": data}, 3)
    b = r.per_device_bytes
    measured = b["measured"]["arguments"] - b["layout"]["batch"]  # params + optimizer state
    formula = b["formula"]["params"] + b["formula"]["optimizer"]
    assert abs(measured / formula - 1) < 0.05
    assert r.zero_unsplit == ["['params']['Dense_2']['bias']"]  # 10 entries: kept whole


def test_training_batchnorm_is_not_exact_and_says_why():
    r = run("flax_batchnorm", {"data": 4}, 0)
    assert not r.exact and "BatchNorm" in r.reason and "not separable" in r.reason
    assert r.max_abs_diff["grads"] > 1e-3                 # per-shard statistics, measured
    assert all(r.bound_ratio[q] <= 1 for q in r.bound)  # the mesh does that exactly
    # the running statistics do not affect the loss: no gradient is sent for them
    assert any("['batch_stats']['BatchNorm_0']['mean']" in n for n in r.notes)
    assert [c["ratio"] for c in r.collectives] == [pytest.approx(1.0)]


def test_dropout_key_is_not_exact_and_shards_draw_their_own_masks():
    r = run("flax_mlp_dropout", {"data": 4}, 0)
    assert not r.exact and "dropout" in r.reason and "fold_in" in r.reason
    assert r.max_abs_diff["loss"] > 1e-3
    assert all(r.bound_ratio[q] <= 1 for q in r.bound)


def test_megatron_rules_name_the_usual_layers():
    import equinox as eqx

    rules = dict(megatron_rules(eqx.filter(equinox_mlp.make_model(), eqx.is_array)))
    assert rules == {r"\.layers\[0\]\.weight$": jax.sharding.PartitionSpec("model"),
                     r"\.layers\[0\]\.bias$": jax.sharding.PartitionSpec("model"),
                     r"\.layers\[1\]\.weight$": jax.sharding.PartitionSpec(None, "model"),
                     r"\.layers\[1\]\.bias$": jax.sharding.PartitionSpec()}
    mha = eqx.nn.MultiheadAttention(4, 16, key=jax.random.key(0))
    specs = {rx.split(".")[1].split("\\")[0]: s for rx, s in megatron_rules(mha)}
    assert specs == {"query_proj": jax.sharding.PartitionSpec("model"),
                     "key_proj": jax.sharding.PartitionSpec("model"),
                     "value_proj": jax.sharding.PartitionSpec("model"),
                     "output_proj": jax.sharding.PartitionSpec(None, "model")}
    rules = megatron_rules(built("flax_transformer")[1])
    assert len(rules) == 12 and all(r"Block_\d+" in rx for rx, _ in rules)  # one per layer kind


def _buffers(arrays) -> dict:
    """``{(device, buffer address): bytes}`` of the arrays' device buffers (a replicated array's
    once per device; a shard's view and its array are one buffer)."""
    return {(s.device.id, s.data.unsafe_buffer_pointer()): s.data.nbytes
            for x in arrays for s in x.addressable_shards}


class _LiveBytes(Recorder):
    """At every recorded point of every step: the bytes of the device buffers alive that were
    not alive before the run."""

    def __init__(self):
        super().__init__(None)
        self.kept = jax.live_arrays()            # alive through the run: no address reused
        self.before = set(_buffers(self.kept))
        self.samples = []

    def __call__(self, kind, step, quantity, tree):
        now = _buffers(jax.live_arrays())
        self.samples.append((kind, step, quantity,
                             sum(b for k, b in now.items() if k not in self.before)))


class _AtMeshCalls:
    """The compiled sharded step, probed: at every call, the bytes of the new device buffers
    alive beside the call's own arguments (what the run holds while its largest program runs)."""

    def __init__(self, compiled, probe: _LiveBytes):
        self.compiled, self.probe, self.held = compiled, probe, []

    def __getattr__(self, name):
        return getattr(self.compiled, name)

    def __call__(self, *args):
        own = _buffers(jax.tree.leaves(args))
        now = _buffers(jax.live_arrays())
        self.held.append(sum(b for k, b in now.items()
                             if k not in self.probe.before and k not in own))
        return self.compiled(*args)


def test_gpt2_shaped_run_holds_a_few_training_states_flat_in_the_steps(monkeypatch):
    """GPT-2's code (one block, 32 wide) on data=4,model=2 with ZeRO-3: at every point of every
    step the run holds at most 4 training states (params + optimizer state + gradients) of new
    arrays, and as many at the last step as at the second (the first still trains the factory's
    own parameters): nothing per step outlives it. While the sharded step runs, the run holds
    beside the step's own arguments at most one device's parameters and optimizer state (the
    trajectory it follows), and as much at the last step as at the second."""
    import flax_gpt2

    from mlsys_jax.parallel.shard import step as shard_step

    loss_fn, params, batch, optimizer = flax_gpt2.train(flax_gpt2.ONE_BLOCK)
    probe, steps, calls = _LiveBytes(), 4, []
    compile_sharded = shard_step.compile_sharded

    def probed(*args, **kwargs):
        calls.append(_AtMeshCalls(compile_sharded(*args, **kwargs), probe))
        return calls[-1]
    monkeypatch.setattr(shard_step, "compile_sharded", probed)
    simulate(loss_fn, params, batch, optimizer, {"data": 4, "model": 2}, ShardOptions(
        zero=3, steps=steps, xla_options=comm.QUICK_COMPILE, time_repeats=0, record=probe))
    opt_state = comm.nbytes(jax.eval_shape(optimizer.init, params))
    state = 2 * comm.nbytes(params) + opt_state
    held = max(b for *_, b in probe.samples)
    assert held <= 4 * state, (held, state)
    by_point = {}
    for kind, step, quantity, b in probe.samples:
        by_point.setdefault((kind, quantity), {})[step] = b
    for point, per_step in by_point.items():
        if len(per_step) > 2:
            assert per_step[steps - 1] == per_step[1], (point, per_step)
    beside = calls[0].held          # teacher-forced steps, then free-running ones (their first
    assert len(beside) == 2 * steps - 1   # is the first teacher-forced one: same state, program)
    assert max(beside) <= comm.nbytes(params) + opt_state + 4096, (beside, state)  # + scalars
    assert beside[steps - 1] == beside[1] and beside[-1] == beside[steps + 1], beside
