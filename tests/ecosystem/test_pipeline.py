"""Users' flax, haiku and equinox layer stacks as pipeline stages (``mlsys_jax.parallel.pipe``),
in float32, 2 AdamW steps against one device (a second step starts from the state the first
one left: the state carried between steps is checked as well as the first step).

Each (model, mesh, schedule) is planned, compiled and run once per module; the assertions read
the report.
"""
import contextlib
import io
import itertools
import json
import os
from fractions import Fraction

import jax
import pytest

import pipeline_stacks
from mlsys_jax import cli
from mlsys_jax.parallel.comm import FAST_COMPILE
from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline

pytestmark = pytest.mark.slow   # each model is planned, compiled and run

# Runs compile with FAST_COMPILE (parallel/comm.py); the command line's own options are
# exercised by the haiku test below.

# Four blocks on four stages: one block per stage, with interior stages that both receive and
# send (a residual stream crosses every boundary).
MODELS = {
    "flax_transformer": lambda: pipeline_stacks.transformer(layers=4, d_model=16, heads=2,
                                                            hidden=32, vocab=16, seq=4),
    "equinox_mlp": pipeline_stacks.equinox_mlp,
    "scan_mlp": pipeline_stacks.scan_mlp,
    "batchnorm_mlp": lambda: pipeline_stacks.batchnorm_mlp(depth=2),
}
_REPORTS: dict = {}
EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "examples")


def run(model, mesh, schedule, remat=False, microbatches=8):
    key = (model, tuple(mesh.items()), schedule, remat, microbatches)
    if key not in _REPORTS:
        plan = plan_pipeline(*MODELS[model](), mesh, microbatches, schedule=schedule, remat=remat)
        _REPORTS[key] = (plan, run_pipeline(plan, 2, options=FAST_COMPILE, stage_memory=False))
    return _REPORTS[key]


def _slowest_stage(costs, stage_of_unit) -> float:
    return max(sum(c for c, s in zip(costs, stage_of_unit) if s == k)
               for k in set(stage_of_unit))


def test_flax_transformer_data_and_pipe_is_exact_1f1b():
    plan, r = run("flax_transformer", {"data": 2, "pipe": 4}, "1f1b", microbatches=4)
    assert r.exact and r.separable, r.reason
    assert r.unit_source == "name stack"
    assert r.units == ["Embed_0"] + [f"Block_{i}" for i in range(4)] + ["LayerNorm_0", "Dense_0"]
    # the balanced split is the best contiguous one by the units' costs (every way to cut the
    # units into 4 stages tried), and within 20% of the mean: units are whole, so with one
    # block per stage the last stage also carries the final norm and the head
    costs, n = plan.unit_costs, len(plan.unit_costs)
    best = min(_slowest_stage(costs, [sum(i >= c for c in cuts) for i in range(n)])
               for cuts in itertools.combinations(range(1, n), 3))
    assert _slowest_stage(costs, plan.stage_of_unit) == best
    assert r.balance["max_over_mean"] <= 1.2
    assert r.bubble["executed"] == r.bubble["formula"] == Fraction(3, 7)  # (P - 1) / (M + P - 1)
    assert r.bubble["idle_steps"] == [6, 6, 6, 6]
    assert r.in_flight["executed"] == r.in_flight["table"] == [4, 3, 2, 1]
    # one residual stream crosses each boundary: rows/(D*M) x seq x d_model floats, M each way
    for b in r.p2p["boundaries"]:
        assert b["values"] == ["float32[2,4,16]"] and b["sends"] == [4, 4]
        assert b["measured"] == b["formula"] == 4 * 2 * (2 * 4 * 16 * 4)
    assert r.p2p["ratio"] == 1.0
    for q in ("loss", "grads", "params"):  # judged against noise the machine measured
        assert r.teacher_forced[q]["diff"] <= r.teacher_forced[q]["bound"]
    assert r.teacher_forced["grads"]["noise"] > 0


def test_flax_transformer_stages_hold_a_quarter_of_the_blocks():
    plan, r = run("flax_transformer", {"data": 2, "pipe": 4}, "1f1b", microbatches=4)
    block = sum(s["params_bytes"] for s in r.stages) - sum(
        plan.leaves.avals[i].size * 4 for i, p in enumerate(plan.paths)
        if "Block" not in jax.tree_util.keystr(p))
    per_block = block / 4
    for s in r.stages:
        blocks = sum(u.startswith("Block") for u in s["units"])
        assert blocks == 1
        extra = s["params_bytes"] - blocks * per_block  # the embedding, or the final norm + head
        assert 0 <= extra <= 0.2 * s["params_bytes"]


@pytest.fixture(scope="module")
def haiku_cli(tmp_path_factory):
    """haiku's MLP through the command line: GPipe at given split points, JSON and a plot."""
    plot = tmp_path_factory.mktemp("plot") / "timeline.png"
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = cli.main(["shard", f"{EXAMPLES}/pipeline_stacks.py:haiku_mlp", "--mesh",
                         "pipe=4", "--microbatches", "8", "--schedule", "gpipe", "--split",
                         "linear_4,linear_7,linear_10", "--steps", "2", "--json", "--plot",
                         str(plot)])
    return code, json.loads(out.getvalue()), plot


def test_haiku_mlp_gpipe_from_the_command_line(haiku_cli):
    code, r, plot = haiku_cli
    assert code == 0 and r["exact"], r["reason"]
    assert r["units"] == [f"linear_{i}" for i in range(13)] and r["unit_source"] == "name stack"
    assert [s["units"][0] for s in r["stages"]] == ["linear_0", "linear_4", "linear_7",
                                                    "linear_10"] and r["split_given"]
    assert r["bubble"]["executed"] == {"fraction": "3/11", "value": 3 / 11}
    assert r["in_flight"]["executed"] == [8, 8, 8, 8] and r["in_flight"]["buffer_rows"] == 8
    assert r["p2p"]["ratio"] == 1.0
    mem = r["memory"]["stages"]
    assert all(m["compiled_temp"] > 0 for m in mem)
    assert [m["params"] for m in mem] == [s["params_bytes"] for s in r["stages"]]
    # Adam's state is two parameter-shaped trees and a step count per stage
    assert all(m["optimizer_state"] == 2 * m["params"] + 4 for m in mem)
    # one SPMD program: every device holds the largest stage's parameters and the M stash rows
    assert r["memory"]["padded"]["params"] == max(m["params"] for m in mem)
    assert r["memory"]["padded"]["stash_rows"] == 8
    assert plot.stat().st_size > 0


def test_the_text_report_fits_120_columns(haiku_cli):
    from mlsys_jax.cli.commands.shard_pipe import render

    _, r, _ = haiku_cli
    text = render("examples/pipeline_stacks.py:haiku_mlp", r, 8)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert text.startswith("examples/pipeline_stacks.py:haiku_mlp: mesh pipe=4, gpipe, 8 "
                           "microbatches")
    assert "exact: yes" in text and "bubble (executed): 3/11 = 27.3%" in text
    assert "measured / formula = 1" in text


def test_equinox_mlp_stages_follow_its_parameter_paths():
    _, r = run("equinox_mlp", {"data": 2, "pipe": 4}, "1f1b")
    assert r.exact, r.reason
    assert r.unit_source == "parameter paths"
    assert r.units == [f"layers[{i}]" for i in range(13)]
    assert r.in_flight["executed"] == [4, 3, 2, 1] and r.p2p["ratio"] == 1.0
    assert r.balance["max_over_mean"] <= 1.15


def test_nn_scan_stack_is_cut_by_slicing_the_stacked_parameters():
    plan, r = run("scan_mlp", {"pipe": 4}, "1f1b", remat=True, microbatches=4)
    assert r.exact, r.reason
    assert r.units[1:17] == [f"blocks[{i}]" for i in range(16)]
    cut = [p.rows for p in plan.split.placements if p.kind == "rows"]
    assert cut and all(rows == ((0, 4), (4, 8), (8, 12), (12, 16)) for rows in cut)
    assert r.stacked["per_stage"] == [r.stacked["total"] // 4] * 4
    assert r.stacked["max_over_equal_share"] == 1.0
    assert plan.program.res is None  # --remat: only stage inputs are stashed
    assert r.p2p["ratio"] == 1.0 and r.in_flight["executed"] == [4, 3, 2, 1]


def test_training_batchnorm_is_not_separable_and_says_so():
    _, r = run("batchnorm_mlp", {"pipe": 2}, "1f1b", microbatches=4)
    assert not r.exact and not r.separable
    assert "not separable over microbatches" in r.reason and "BatchNorm" in r.reason
    assert "the pipeline computes exactly that" in r.reason
    sep = r.teacher_forced["separability"]
    assert sep["diff"] > 1e3 * sep["bound"]  # whole batch vs microbatches: far beyond noise


def test_an_equinox_list_of_blocks_is_a_unit_per_block():
    """equinox's GPT holds its blocks in a Python list whose leaves sit two levels deeper than
    the embeddings': each block is a unit at the coarsest level, never the list as one. Planned
    on shapes, as ``mlsys-jax plan`` plans a pipeline (the units come from the trace alone)."""
    import equinox_gpt

    with jax.enable_x64(False):
        loss_fn, params, batch, optimizer = equinox_gpt.train(equinox_gpt.TINY, abstract=True)
        plan = plan_pipeline(loss_fn, params, batch, optimizer, {"pipe": 2}, 2, hw="h100")
    names = [u.name for u in plan.units.units]
    assert [n for n in names if n.startswith("blocks")] == ["blocks[0]", "blocks[1]"]


def test_an_nnx_list_of_blocks_is_a_unit_per_block():
    """nnx keeps a list's items under integer keys of its state: each block is a unit. Planned
    on shapes (``nnx.eval_shape``), as ``mlsys-jax plan`` plans a pipeline."""
    import jax.numpy as jnp
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, d, rngs):
            self.lin = nnx.Linear(d, d, rngs=rngs)

        def __call__(self, x):
            return x + jnp.tanh(self.lin(x))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.inp = nnx.Linear(4, 16, rngs=rngs)
            self.blocks = nnx.List([Block(16, rngs) for _ in range(3)])
            self.out = nnx.Linear(16, 1, rngs=rngs)

        def __call__(self, x):
            x = self.inp(x)
            for b in self.blocks:
                x = b(x)
            return self.out(x)

    with jax.enable_x64(False):
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Net(nnx.Rngs(0))))

        def loss(state, batch):
            return jnp.mean((nnx.merge(graphdef, state)(batch["x"]) - batch["y"]) ** 2)
        batch = {"x": jnp.ones((8, 4)), "y": jnp.ones((8, 1))}
        plan = plan_pipeline(loss, state, batch, optax.adam(1e-3), {"pipe": 2}, 2, hw="h100")
    assert [u.name for u in plan.units.units] == ["inp", "blocks[0]", "blocks[1]", "blocks[2]",
                                                   "out"]
