"""TASO-style search: α = 1.05 passes through step ③ to the lecture's 2-kernel graph; greedy
(α = 1.0) takes only improving steps and stops at 4; started from the default pipeline's result
it never loses to the pipeline; refusals reported; a rule registered as docs/architecture.md says
becomes a move."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import ir, models
from mlsys_jax.errors import MlsysError
from mlsys_jax.passes.search import search


@pytest.fixture(scope="module")
def block():
    rng = np.random.default_rng(0)
    bn = lambda: {"gamma": 1 + 0.1 * rng.standard_normal(64), "beta": 0.1 * rng.standard_normal(64),  # noqa: E731
                  "mean": 0.1 * rng.standard_normal(64), "var": 1 + 0.1 * rng.random(64)}
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), {
        "w3": rng.standard_normal((64, 64, 3, 3)) / 24, "w1": rng.standard_normal((64, 64, 1, 1)) / 8,
        "bn3": bn(), "bn1": bn()})
    return ir.trace(partial(models.resnet_block, p),
                    jax.ShapeDtypeStruct((32, 64, 56, 56), jnp.float32))


def _lecture_graph(block):
    """The §4.2 block after the lecture's five steps, as the passes make it."""
    from mlsys_jax.passes import chain, dce, enlarge_conv_kernel, fold_conv_bn, \
        merge_parallel_convs, run

    steps = chain(fold_conv_bn(), merge_parallel_convs(), enlarge_conv_kernel(),
                  merge_parallel_convs(), dce())
    return run(steps, block, cost=False).jaxpr


def test_search_finds_two_kernels_through_the_worse_step(block):
    from mlsys_jax.passes import cost_summary

    r = search(block, alpha=1.05, hw="h100", dtype="bf16", pipeline=None)  # the lecture's search
    assert r.best_cost == cost_summary(_lecture_graph(block), "h100", "bf16")
    assert r.best_cost["kernels"] == 2
    rules = [s.rule for s in r.path]
    assert "enlarge_conv_kernel" in rules and rules[-1] == "merge_parallel_convs"
    i = rules.index("enlarge_conv_kernel")
    assert r.path[i].time_us > r.path[i - 1].time_us  # worse before better (§4.2 step ③)
    assert [op.name for op in ir.op_view(r.best)] == ["conv_bias", "relu"]
    assert r.explored <= 100


def test_greedy_stops_at_step_two(block):
    r = search(block, alpha=1.0, hw="h100", dtype="bf16", pipeline=None)
    assert r.best_cost["kernels"] == 4
    times = [r.start["time_us"]] + [s.time_us for s in r.path]
    assert all(b < a for a, b in zip(times, times[1:]))  # only steps that improve
    assert "enlarge_conv_kernel" not in [s.rule for s in r.path]


def test_search_rejects_bad_settings(block):
    with pytest.raises(MlsysError, match="alpha"):
        search(block, alpha=0.5)
    with pytest.raises(MlsysError, match="unknown pass"):
        search(block, rules=["nope"])
    with pytest.raises(MlsysError, match="'dce'; choose from fold_conv_bn"):  # not a search move
        search(block, rules=["dce"])
    with pytest.raises(MlsysError, match="unknown hardware"):
        search(block, hw="tpu9")
    with pytest.raises(MlsysError, match="budget must be a whole number"):
        search(block, budget=0)
    with pytest.raises(MlsysError, match="measure must be"):
        search(block, measure=-1)
    with pytest.raises(MlsysError, match="unknown pass"):
        search(block, pipeline="fold_conv_bn,nope")


def test_search_starts_from_the_pipeline_and_reports_what_still_refuses(block):
    r = search(block, alpha=1.05, hw="h100", dtype="bf16", budget=10)
    assert r.path[0].rule == "pipeline" and r.path[0].kernels == 4  # both BNs folded
    rules = [s.rule for s in r.path[1:]]
    assert "pipeline" not in rules and rules[-1] == "merge_parallel_convs"
    assert rules.index("enlarge_conv_kernel") < len(rules) - 1  # enlarged before the merge
    assert r.best_cost["kernels"] == 2 and r.explored <= 10
    assert [w.rule for w in r.rewrites].count("fold_conv_bn") == 2
    greedy = search(block, alpha=1.0, hw="h100", dtype="bf16")
    assert [s.rule for s in greedy.path] == ["pipeline"] and greedy.best_cost["kernels"] == 4
    # the greedy graph still has the 1×1 beside the 3×3: merge refuses, naming the window
    assert any("window size differs: 3×3 vs 1×1" in x.reason for x in greedy.refusals)
    assert not r.refusals  # nothing left to refuse in the 2-kernel graph


def test_budget_of_one_graph_is_never_worse_than_the_pipeline(block):
    from mlsys_jax.passes import cost_summary, pipeline, run

    piped = cost_summary(run(pipeline(), block).jaxpr, "h100", "bf16")
    r = search(block, alpha=1.05, hw="h100", dtype="bf16", budget=1)
    assert r.explored == 1 and r.best_cost["time_us"] <= piped["time_us"]
    assert r.best_cost["kernels"] <= piped["kernels"]


@pytest.mark.slow
def test_measure_times_a_shortlist_beside_the_original_and_returns_the_fastest():
    rng = np.random.default_rng(1)
    p = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), {
        "w3": rng.standard_normal((8, 8, 3, 3)) / 8, "w1": rng.standard_normal((8, 8, 1, 1)) / 3,
        "bn3": {"gamma": np.ones(8), "beta": np.zeros(8), "mean": np.zeros(8), "var": np.ones(8)},
        "bn1": {"gamma": np.ones(8), "beta": np.zeros(8), "mean": np.zeros(8), "var": np.ones(8)}})
    small = ir.trace(partial(models.resnet_block, p), jax.ShapeDtypeStruct((2, 8, 10, 10),
                                                                          jnp.float32))
    # α = 1 would stop at the pipeline's graph; measured, the estimate only shortlists
    r = search(small, alpha=1.0, hw="h100", dtype="bf16", measure=3, repeats=1)
    rows = r.measured["candidates"]
    assert len(rows) == 4 and rows[0]["rules"] == [] and r.measured["rounds"] == 1
    assert min(c["kernels"] for c in rows) == 2  # the 2-kernel graph is among those timed
    picked = rows[r.measured["picked"]]
    assert picked["median_us"] == min(c["median_us"] for c in rows)
    assert [s.rule for s in r.path] == picked["rules"]
