"""A user's step under jax.jit + NamedSharding (parallel.simulate) on plain JAX code, float64.

The lecture's explicit shard_map DP and ZeRO (experiment 04) and the jit version agree on the
lecture's MLP; bad inputs fail with one line naming the fix; non-separable losses are detected.
"""
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import apply_rules, comm, make_mesh, ShardOptions, simulate
from mlsys_jax.parallel.lecture import data, zero
from mlsys_jax.parallel.shard import separability as separable, separability_of
from mlsys_jax.parallel.shard.setup import prepare as plan

STEPS, TOL = 2, 1e-12


def lecture_loss(params, batch):
    return mlp_loss(params, batch["x"], batch["y"])


@pytest.fixture(scope="module")
def lecture():
    params, x, y = data.demo_problem(0, 32, (16, 32, 4))
    return params, {"x": x, "y": y}, optax.adam(0.05), {}


def _jit_params(lecture, stage):
    params, batch, opt, cache = lecture
    r = simulate(lecture_loss, params, batch, opt, {"data": 4}, ShardOptions(
        zero=stage, steps=STEPS, xla_options=comm.QUICK_COMPILE, time_repeats=0, keep_params=True),
        cache=cache)
    assert r.exact, r.reason
    return r.sharded["free"]["params"]


@pytest.mark.slow
def test_shard_map_dp_of_experiment_04_equals_the_jit_version(lecture):
    params, batch, opt, _ = lecture
    mesh = make_mesh({"data": 4})
    step = data.make_dp_step(mlp_loss, opt, mesh)
    p, s = params, opt.init(params)
    for _ in range(STEPS):
        p, s, _, _ = step(p, s, batch["x"], batch["y"])
    assert data.max_abs_diff(p, _jit_params(lecture, 0)) < TOL


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_shard_map_zero_of_experiment_04_equals_the_jit_version(lecture, stage):
    params, batch, opt, _ = lecture
    mesh = make_mesh({"data": 4})
    zs = zero.make_zero_step(mlp_loss, opt, params, mesh, stage)
    flat, s = zs.init(params)
    mask = np.ones(len(batch["x"]))
    args = data.shard_batch(mesh, "data", batch["x"], batch["y"], mask)
    for _ in range(STEPS):
        flat, s, _, _ = zs.step(flat, s, *args)
    assert data.max_abs_diff(zs.unflatten(flat), _jit_params(lecture, stage)) < TOL


def _bn_loss(params, batch):  # a batch-normalised hidden layer: couples the examples
    h = batch["x"] @ params["W1"]
    h = (h - h.mean(0)) / jnp.sqrt(h.var(0) + 1e-5)
    return jnp.mean((jnp.tanh(h) @ params["W2"] - batch["y"]) ** 2)


@pytest.mark.slow
def test_separability_names_the_cause(lecture):
    params, batch, _, _ = lecture
    sep = lambda f: separability_of(f, params, batch, 4, options=comm.QUICK_COMPILE)
    assert sep(lecture_loss).separable
    summed = sep(lambda p, b: jnp.sum((b["x"] @ p["W1"]) ** 2))
    assert not summed.separable and "sums over the batch" in summed.causes[0]
    coupled = sep(_bn_loss)
    assert not coupled.separable and "batch statistic" in coupled.causes[0]
    key = jax.random.PRNGKey(7)  # a raw uint32 key, closed over: folded where it is wrapped
    dropped = lambda p, b: jnp.mean(jax.random.bernoulli(key, 0.5, b["x"].shape) * b["x"])
    got = sep(dropped)
    assert not got.separable and got.folded_keys == 1 and "fold_in" in got.causes[0]


@pytest.mark.slow
def test_per_shard_keys_draw_different_masks(lecture):
    params, batch, _, _ = lecture
    key = jax.random.key(3)
    mask_mean = lambda p, b: jnp.mean(jax.random.uniform(key, b["x"].shape))
    f, folded = separable.per_shard_losses(mask_mean, params, batch, 4)
    shards = separable.shards_of(batch, 4)
    same = jax.vmap(lambda s: mask_mean(params, s))(shards)           # one key: one mask for all
    assert folded == 1 and len(set(np.asarray(same).tolist())) == 1
    assert len(set(np.asarray(jax.jit(f)(params, shards)).tolist())) == 4  # fold_in(key, shard)


def test_rules_first_match_wins_and_unmatched_are_reported(lecture):
    params, *_ = lecture
    mesh = make_mesh({"data": 2, "model": 2})
    got = apply_rules(params, [(r"W1", P(None, "model")), (r"W\d", P("model")),
                               (r"W1", P())], mesh)
    assert got.specs["['W1']"] == P(None, "model") and got.specs["['W2']"] == P("model")
    assert set(got.unmatched) == {"['b1']", "['b2']"}


@pytest.mark.parametrize("rules, match", [
    ([(r"b2", P("model"))], r"splits dimension 0 \(size 4\) of \['b2'\].*does not divide"),
    ([(r"W1", P("tensor"))], r"axis 'tensor', which is not in the mesh"),
    ([(r"W1", P(None, None, "model"))], r"3 entries.*at most 2"),
    ([("W1[", P())], r"not a regular expression"),
    ([("W1", "model")], r"not a \(regex, PartitionSpec\) pair"),
])
def test_bad_rules_fail_with_one_line(lecture, rules, match):
    params, *_ = lecture
    mesh = make_mesh({"model": 8})
    with pytest.raises(MlsysError, match=match):
        apply_rules(params, rules, mesh)


def test_bad_inputs_name_the_fix(lecture):
    params, batch, opt, _ = lecture
    with pytest.raises(MlsysError, match="GradientTransformation"):
        plan(lecture_loss, params, batch, "adam", {"data": 4})
    with pytest.raises(MlsysError, match=r"batch of 30 rows does not split over data=4.*"
                                         r"data=D with D in \[1, 2, 3, 5, 6, 10, 15, 30\]"):
        plan(lecture_loss, params, jax.tree.map(lambda x: x[:30], batch), opt, {"data": 4})
    with pytest.raises(MlsysError, match=r"mesh \{'data': 3\} of 3 devices does not divide"):
        plan(lecture_loss, params, batch, opt, {"data": 3})
    with pytest.raises(MlsysError, match=r"mesh axis 'pipe' is not one of data, model"):
        plan(lecture_loss, params, batch, opt, {"pipe": 2})
    with pytest.raises(MlsysError, match="must return a float scalar"):
        plan(lambda p, b: (b["x"] @ p["W1"]), params, batch, opt, {"data": 4})
    with pytest.raises(MlsysError, match="same leading batch axis"):
        plan(lecture_loss, params, {"x": batch["x"], "y": batch["y"][:8]}, opt, {"data": 4})
    with pytest.raises(MlsysError, match=r"--zero must be one of 0, 1, 2, 3"):
        plan(lecture_loss, params, batch, opt, {"data": 4}, zero=4)
    with pytest.raises(MlsysError, match=r"needs 16 devices but only 8"):
        plan(lecture_loss, params, batch, opt, {"data": 16})


@pytest.mark.slow
@pytest.mark.parametrize("name, opt", [("sgd", optax.sgd(0.1)), ("adafactor", optax.adafactor(0.01))])
def test_any_optax_optimizer_state_is_laid_out(lecture, name, opt):
    """Stateless SGD updates in place (no all-gather); Adafactor's factored rows mirror no
    parameter and are split by their own shape."""
    params, batch, _, _ = lecture
    r = simulate(lecture_loss, params, batch, opt, {"data": 4}, ShardOptions(
        zero=1, steps=STEPS, xla_options=comm.QUICK_COMPILE, time_repeats=0))
    assert r.exact, r.reason
    kinds = {c["kind"]: c["ratio"] for c in r.collectives}
    assert kinds == ({"all-reduce": 1.0} if name == "sgd" else
                     {"all-reduce": 1.0, "all-gather": 1.0})
    b = r.per_device_bytes
    assert b["measured"]["arguments"] == b["expected"]["arguments"]


@pytest.mark.slow
def test_memory_is_flat_in_the_step_count_and_clipping_stays_global(lecture):
    """Nothing per step outlives its step: the arrays alive after 6 steps are those alive after
    2, and the report holds as many figures. The optimizer clips by the global norm under ZeRO-3:
    a norm computed per shard (as inside shard_map) would differ; on global arrays under jit it
    cannot, at every step of both runs."""
    params, batch, _, _ = lecture
    opt = optax.chain(optax.clip_by_global_norm(0.05), optax.adam(0.05))
    cache, alive, sizes = {}, [], []
    for steps in (2, 6):
        before = {id(x) for x in jax.live_arrays()}
        r = simulate(lecture_loss, params, batch, opt, {"data": 4}, ShardOptions(
            zero=3, steps=steps, xla_options=comm.QUICK_COMPILE, time_repeats=0), cache=cache)
        alive.append(sum(1 for x in jax.live_arrays() if id(x) not in before))
        sizes.append(len(jax.tree.leaves(json.loads(json.dumps(r.to_json())))))
        assert r.exact and r.max_abs_diff["params"] < TOL, (steps, r.reason, r.max_abs_diff)
        del r
    assert alive[1] <= alive[0] and sizes[1] == sizes[0]


@pytest.mark.parametrize("spec", [P("data"), P(None, "data"), P(("model", "data")), P(),
                                  P("model", "data")])
def test_leaf_comparisons_read_shards_a_block_at_a_time(monkeypatch, spec):
    """The run's comparisons (max |a - b|, max |a|) read a sharded leaf shard by shard, a few
    elements at a time, and give the float64 figures of whole host copies; a NaN on one side
    is an Inf difference (never lost in a max), and max |a| is over the finite elements."""
    from jax.sharding import NamedSharding

    from mlsys_jax.parallel.shard import compare

    monkeypatch.setattr(compare, "BLOCK", 7)   # several blocks per shard
    mesh = make_mesh({"data": 4, "model": 2})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 24), dtype=np.float32)
    y = x + np.float32(1e-3) * rng.standard_normal((8, 24), dtype=np.float32)
    on_mesh, one = jax.device_put(x, NamedSharding(mesh, spec)), jnp.asarray(y)

    def whole(u, v=0.0):
        return float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64))))
    for a, b in [(on_mesh, one), (one, on_mesh), (x, y)]:
        assert (compare.leaf_diffs({"s": a[0, 0], "w": a}, {"s": b[0, 0], "w": b})
                == [whole(x[0, 0], y[0, 0]), whole(x, y)])
    assert compare.leaf_scales([on_mesh, one]) == [whole(x), whole(y)]
    x[3, 5] = np.nan
    nan = jax.device_put(x, NamedSharding(mesh, spec))
    assert compare.leaf_diffs(nan, one)[0] == np.inf
    assert compare.leaf_scales(nan)[0] == float(np.nanmax(np.abs(x.astype(np.float64))))
