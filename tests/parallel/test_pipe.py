"""Pipeline parallelism for a user's step (``mlsys_jax.parallel.pipe``): units, splits, layouts,
the partitioned optimizer and a whole run, on plain JAX models (float64, as the suite runs).

Third-party models (flax, haiku, equinox) are in tests/ecosystem/test_pipeline.py.
"""
import itertools
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.comm import QUICK_COMPILE
from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline
from mlsys_jax.parallel.pipe.balance import at_split_points, balanced, check_stage_count
from mlsys_jax.parallel.pipe.flat import FlatLayout, padded_family
from mlsys_jax.parallel.pipe.placement import StageLeaves
from mlsys_jax.parallel.pipe.split import LeafPlacement, build_split
from mlsys_jax.parallel.pipe.step import trace_microbatch
from mlsys_jax.parallel.pipe.units import find_units


def mlp(layers=6, width=8, features=4, rows=8, marked=False, tied=False, seed=0):
    """A list-of-dicts tanh MLP (optionally each layer in a ``jax.named_scope``), mean squared
    error; ``tied``: the last layer reuses the first layer's weight, transposed."""
    rng = np.random.default_rng(seed)
    dims = [features] + [width] * (layers - 1) + [features]
    params = [{"w": rng.standard_normal((a, b)) / np.sqrt(a), "b": 0.1 * rng.standard_normal(b)}
              for a, b in zip(dims[:-1], dims[1:])]
    if tied:
        params[-1].pop("w")
    batch = {"x": rng.standard_normal((rows, features)), "y": rng.standard_normal((rows, features))}

    def loss(p, b):
        h = b["x"]
        for i, layer in enumerate(p):
            w = p[0]["w"].T if tied and i == len(p) - 1 else layer["w"]
            if marked:
                with jax.named_scope(f"layer{i}"):
                    h = jnp.tanh(h @ w + layer["b"])
            else:
                h = jnp.tanh(h @ w + layer["b"])
        return 0.5 * jnp.mean(jnp.sum((h - b["y"]) ** 2, axis=-1))
    return loss, params, batch


def scan_stack(length=8, width=8, rows=8, seed=0):
    """A ``lax.scan`` over 8 stacked layers between an input and an output projection."""
    rng = np.random.default_rng(seed)
    params = {"inp": rng.standard_normal((4, width)) / 2,
              "stack": {"w": rng.standard_normal((length, width, width)) / np.sqrt(width),
                        "b": 0.1 * rng.standard_normal((length, width))},
              "out": rng.standard_normal((width, 4)) / np.sqrt(width)}
    batch = {"x": rng.standard_normal((rows, 4)), "y": rng.standard_normal((rows, 4))}

    def loss(p, b):
        def layer(h, wb):
            return jnp.tanh(h @ wb[0] + wb[1]), None
        h, _ = jax.lax.scan(layer, b["x"] @ p["inp"], (p["stack"]["w"], p["stack"]["b"]))
        return jnp.mean((h @ p["out"] - b["y"]) ** 2)
    return loss, params, batch


def traced(loss, params, batch, rows=2):
    closed = trace_microbatch(loss, params, batch, rows)
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    return closed, paths


# --- units -------------------------------------------------------------------------------------

def test_units_from_named_scope_markers():
    closed, paths = traced(*mlp(marked=True))
    units = find_units(closed, len(paths), paths, 4)
    assert units.source == "name stack"
    assert [u.name for u in units.units] == [f"layer{i}" for i in range(6)]


def test_units_from_parameter_paths_follow_the_dataflow():
    closed, paths = traced(*mlp())
    units = find_units(closed, len(paths), paths, 4)
    assert units.source == "parameter paths"
    assert [u.name for u in units.units] == [f"[{i}]" for i in range(6)]
    # every equation after layer 3's matmul reads layer 3's parameters through the dataflow
    split = build_split(closed, len(paths), units, (0, 0, 0, 1, 1, 1))
    assert [str(split.avals[v]) for v in split.boundaries[0]] == ["float64[2,8]"]
    assert all(p.kind == "owned" for p in split.placements)
    assert [p.owner for p in split.placements] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]


def test_a_stack_scan_is_one_unit_per_iteration_and_cut_by_rows():
    closed, paths = traced(*scan_stack())
    units = find_units(closed, len(paths), paths, 4)
    names = [u.name for u in units.units]
    assert names[:2] == ["inp", "stack[0]"] and names[-2:] == ["stack[7]", "out"]
    stage_of_unit = (0, 0, 0, 1, 1, 2, 2, 3, 3, 3)  # inp + 2 iterations, 2, 2, 2 + out
    split = build_split(closed, len(paths), units, stage_of_unit)
    rows = [p.rows for p, path in zip(split.placements, paths) if "stack" in str(path)]
    assert rows == [((0, 2), (2, 4), (4, 6), (6, 8))] * 2
    assert len(split.boundaries) == 3 and all(len(b) == 1 for b in split.boundaries)


def test_a_weight_read_by_two_stages_is_replicated():
    closed, paths = traced(*mlp(layers=4, tied=True))
    units = find_units(closed, len(paths), paths, 2)
    split = build_split(closed, len(paths), units, (0, 0, 1, 1))
    kinds = {jax.tree_util.keystr(p): pl.kind for p, pl in zip(paths, split.placements)}
    assert kinds["[0]['w']"] == "replicated" and kinds["[1]['w']"] == "owned"


# --- splits ------------------------------------------------------------------------------------

def test_balanced_minimises_the_slowest_stage():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, p = int(rng.integers(3, 9)), int(rng.integers(2, 4))
        costs = list(rng.uniform(1, 10, n))
        got = balanced(costs, p)
        assert sorted(set(got)) == list(range(p)) and list(got) == sorted(got)
        worst = max(sum(c for c, s in zip(costs, got) if s == k) for k in range(p))
        best = min(max(sum(costs[a:b]) for a, b in zip((0,) + cuts, cuts + (n,)))
                   for cuts in itertools.combinations(range(1, n), p - 1))
        assert worst == pytest.approx(best)


def test_split_points_name_where_stages_start():
    closed, paths = traced(*mlp(marked=True))
    units = find_units(closed, len(paths), paths, 3)
    assert at_split_points(units, ["layer2", "layer4"], 3) == (0, 0, 1, 1, 2, 2)
    assert at_split_points(units, ["LAYER_2", "layer4"], 3) == (0, 0, 1, 1, 2, 2)


@pytest.mark.parametrize("names, stages, match", [
    (["layer2"], 3, "make 2 stages, but the mesh has pipe=3; give 2 split point"),
    (["layer9", "layer4"], 3, "'layer9' matches no unit; the units are layer0, layer1"),
    (["layer0", "layer4"], 3, "is the first unit"),
    (["layer4", "layer2"], 3, "distinct units in model order"),
])
def test_split_points_bad_input(names, stages, match):
    closed, paths = traced(*mlp(marked=True))
    units = find_units(closed, len(paths), paths, stages)
    with pytest.raises(MlsysError, match=match):
        at_split_points(units, names, stages)


def test_more_stages_than_units_is_an_error_naming_the_units():
    closed, paths = traced(*mlp(layers=3, marked=True))
    units = find_units(closed, len(paths), paths, 4)
    with pytest.raises(MlsysError, match=r"pipe=4 needs at least 4 units.*layer0, layer1, "
                                         r"layer2.*P <= 3"):
        check_stage_count(units, 4)


# --- layouts -----------------------------------------------------------------------------------

def test_flat_layouts_round_trip_with_padding_and_mixed_dtypes():
    a = [jax.ShapeDtypeStruct((2, 3), np.float32), jax.ShapeDtypeStruct((4,), np.int32),
         jax.ShapeDtypeStruct((0, 3), np.float32), jax.ShapeDtypeStruct((), np.float32)]
    b = [jax.ShapeDtypeStruct((5,), np.float32)]
    la, lb = padded_family([FlatLayout(a), FlatLayout(b)])
    assert la.sizes == lb.sizes == {"float32": 7, "int32": 4}
    assert la.nbytes == 7 * 4 + 4 * 4 and lb.nbytes == 5 * 4 and lb.padded_bytes == 44
    vals = [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(4, dtype=np.int32),
            np.zeros((0, 3), np.float32), np.float32(7)]
    host = la.pack_host(vals)
    assert all(np.array_equal(x, y) for x, y in zip(la.unpack_host(host), vals))
    traced_back = jax.jit(lambda *v: la.unpack(la.pack(v)))(*vals)
    assert all(np.array_equal(x, y) for x, y in zip(traced_back, vals))


def test_stage_leaves_views_and_host_round_trip():
    avals = [jax.ShapeDtypeStruct(s, np.float64) for s in ((5, 3), (8, 2), (3,), ())]
    places = [LeafPlacement("owned", 1), LeafPlacement("rows", rows=((0, 3), (3, 8))),
              LeafPlacement("replicated"), LeafPlacement("replicated")]
    sl = StageLeaves(avals, places, 2)
    assert [a.shape for a in sl.view_avals(0)] == [(0, 3), (3, 2), (3,), ()]
    assert [a.shape for a in sl.view_avals(1)] == [(5, 3), (5, 2), (3,), ()]
    leaves = [np.random.default_rng(i).standard_normal(a.shape) for i, a in enumerate(avals)]
    own, rep = sl.to_host(leaves)
    back = sl.from_host(own, rep)
    assert all(np.array_equal(x, y) for x, y in zip(back, leaves))
    assert sl.bytes_per_stage() == [8 * (6 + 4), 8 * (15 + 10 + 4)]


# --- the optimizer, partitioned ----------------------------------------------------------------

def _toy_tree():
    rng = np.random.default_rng(0)
    tree = {"emb": rng.standard_normal((5, 3)), "head": rng.standard_normal((3, 2)),
            "scale": np.float64(1.5), "stack": rng.standard_normal((8, 3, 3)),
            "tied": rng.standard_normal((4,))}
    places = [LeafPlacement("owned", 0), LeafPlacement("owned", 3), LeafPlacement("replicated"),
              LeafPlacement("rows", rows=((0, 2), (2, 5), (5, 7), (7, 8))),
              LeafPlacement("replicated")]
    return tree, places


def _partitioned_update(opt, tree, places, grads, state):
    """One update through PartitionedOptimizer on a pipe=4 mesh; the new tree and state."""
    from jax.sharding import PartitionSpec as P

    from mlsys_jax.parallel.mesh import make_mesh
    from mlsys_jax.parallel.pipe.flat import stack_host
    from mlsys_jax.parallel.pipe.optim import PartitionedOptimizer

    leaves, treedef = jax.tree.flatten(tree)
    sl = StageLeaves([jax.ShapeDtypeStruct(np.shape(x), np.float64) for x in leaves], places, 4)
    po = PartitionedOptimizer(opt, treedef, sl)
    own, rep = sl.to_host(leaves)
    gown, grep = sl.to_host(jax.tree.leaves(grads))

    def body(*bufs):
        o, r, go, gr, s = (jax.tree.map(lambda x: x[0], b) for b in bufs)
        out = po.apply(jax.lax.axis_index("pipe"), o, r, go, gr, s)
        return jax.tree.map(lambda x: x[None], out)
    f = jax.jit(jax.shard_map(body, mesh=make_mesh({"pipe": 4}), in_specs=P("pipe"),
                              out_specs=P("pipe"), check_vma=False))
    args = (stack_host(own), stack_host([rep] * 4), stack_host(gown), stack_host([grep] * 4),
            stack_host(po.state_to_stages(state)))
    o, r, s = jax.device_get(f.lower(*args).compile(QUICK_COMPILE)(*args))
    per = lambda t: [{k: v[i] for k, v in t.items()} for i in range(4)]
    new = jax.tree.unflatten(treedef, sl.from_host(per(o), per(r)[0]))
    return new, po.state_from_stages(per(s)), po


@pytest.mark.slow
@pytest.mark.parametrize("opt, rounds, exchanges", [
    (optax.chain(optax.clip_by_global_norm(0.1), optax.adamw(1e-2)), 1, 3),
    (optax.adamw(1e-3, mask=lambda t: jax.tree.map(lambda x: jnp.ndim(x) > 1, t)), 0, 0),
], ids=["clip+adamw", "masked-adamw"])
def test_partitioned_optimizer_equals_optax_on_the_whole_tree(opt, rounds, exchanges):
    tree, places = _toy_tree()
    rng = np.random.default_rng(1)
    grads = jax.tree.map(lambda x: rng.standard_normal(np.shape(x)), tree)
    state = opt.init(tree)
    _, state = opt.update(grads, state, tree)  # a non-trivial state
    want_updates, want_state = opt.update(grads, state, tree)
    want = optax.apply_updates(tree, want_updates)
    got, got_state, po = _partitioned_update(opt, tree, places, grads, state)
    for a, b in zip(jax.tree.leaves(got) + jax.tree.leaves(got_state),
                    jax.tree.leaves(want) + jax.tree.leaves(want_state)):
        assert np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0) <= 1e-14
    # the global norm: each stage sums its part of the three leaves it does not hold whole on
    # every stage (emb, head, the stack's rows), then one round exchanges those sums
    assert (po.rounds, len(po.exchange)) == (rounds, exchanges)


def test_an_optimizer_working_along_cut_rows_is_refused():
    from mlsys_jax.parallel.pipe.optim import PartitionedOptimizer

    tree, places = _toy_tree()
    along = optax.GradientTransformation(
        lambda p: optax.EmptyState(),
        lambda g, s, p=None: (jax.tree.map(lambda x: jnp.cumsum(x, axis=0) if jnp.ndim(x) else x,
                                           g), s))
    leaves, treedef = jax.tree.flatten(tree)
    sl = StageLeaves([jax.ShapeDtypeStruct(np.shape(x), np.float64) for x in leaves], places, 4)
    with pytest.raises(MlsysError, match="applies cumsum along the rows of a parameter cut"):
        PartitionedOptimizer(along, treedef, sl)
    shapes = optax.GradientTransformation(
        lambda p: optax.EmptyState(),
        lambda g, s, p=None: (jax.tree.map(lambda x: -x if np.size(x) > 6 else x, g), s))
    with pytest.raises(MlsysError, match="branches on parameter shapes"):
        PartitionedOptimizer(shapes, treedef, sl)


# --- a whole run -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_stages():
    """Four layers on two stages, the last tied to the first layer's weight (replicated)."""
    loss, params, batch = mlp(layers=4, rows=8, tied=True)
    opt = optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2))
    plan = plan_pipeline(loss, params, batch, opt, {"pipe": 2}, 4, schedule="1f1b", hw="h100")
    return plan, run_pipeline(plan, steps=2, options=QUICK_COMPILE, stage_memory=False)


@pytest.mark.slow
def test_a_two_stage_run_is_exact_and_its_figures_come_from_what_ran(two_stages):
    plan, r = two_stages
    assert r.exact, r.reason
    assert r.bubble["executed"] == r.bubble["formula"] == r.bubble["table"] == Fraction(1, 5)
    assert r.in_flight["executed"] == [2, 1]
    assert r.p2p["ratio"] == 1.0 and r.p2p["measured"] == 4 * 2 * (2 * 8 * 8)
    assert r.p2p["boundaries"][0]["sends"] == [4, 4]
    assert [s["units"] for s in r.stages] == [["[0]", "[1]"], ["[2]", "[3]"]]
    tied = [p.kind for p in plan.split.placements]
    assert tied.count("replicated") == 1 and r.replica_spread == 0.0  # its copies agree


@pytest.mark.slow
@pytest.mark.parametrize("quantity, factor, named", [
    ("grads", 1 + 1e-9, "grads"), ("params", 1 + 1e-11, "params")])
def test_the_verdict_sees_a_pipeline_off_by_a_little(two_stages, monkeypatch, quantity,
                                                     factor, named):
    """The same run with the pipeline's gradients (or new parameters) scaled by 1 + 1e-9 (or
    1 + 1e-11): far above float64's rounding (this run's dtype), yet caught."""
    plan, _ = two_stages
    step = type(plan).step

    def off(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        out[quantity] = jax.tree.map(lambda x: x * factor, out[quantity])
        return out
    monkeypatch.setattr(type(plan), "step", off)
    r = run_pipeline(plan, steps=1, options=QUICK_COMPILE, stage_memory=False)
    assert not r.exact and f"max |Δ{named}|" in r.reason, r.reason


@pytest.mark.parametrize("mesh, m, match", [
    ({"pipe": 3}, 4, "uses 3 devices, which does not divide the 8"),
    ({"pipe": 2, "model": 2}, 4, "mesh axis 'model' is not one of data, pipe"),
    ({"data": 2}, 4, "the mesh needs a pipe axis"),
    ({"pipe": 4}, 2, "--microbatches 2 is fewer than the 4 pipeline stages"),
    ({"data": 2, "pipe": 2}, 3, "does not split into data=2 x 3 microbatches"),
])
def test_bad_pipeline_inputs_are_one_line_errors(mesh, m, match):
    loss, params, batch = mlp(layers=4, rows=8)
    with pytest.raises(MlsysError, match=match):
        plan_pipeline(loss, params, batch, optax.sgd(0.1), mesh, m, schedule="1f1b")


@pytest.mark.slow  # three sets of one-device programs compiled: ~2 s
def test_plans_of_one_loss_share_their_one_device_programs():
    """1F1B and GPipe plans of one loss, batch and optimizer are judged against the same
    one-device programs, compiled once; another batch object or another loss function (even
    one computing the same) compiles its own."""
    from mlsys_jax.parallel.pipe import one_device

    loss, params, batch = mlp(layers=4, rows=8)
    opt = optax.sgd(0.1)

    def programs(loss=loss, batch=batch, schedule="1f1b"):
        plan = plan_pipeline(loss, params, batch, opt, {"pipe": 2}, 4, schedule=schedule,
                             hw="h100")
        return one_device.programs(plan, 4, QUICK_COMPILE, narrow=None, random=False,
                                   s0=jax.jit(opt.init)(plan.trainable))
    first = programs()
    assert programs(schedule="gpipe") is first
    assert programs(batch={k: v.copy() for k, v in batch.items()}) is not first
    assert programs(loss=lambda p, b: loss(p, b)) is not first
