"""TASO-style search: α = 1.05 passes through step ③ to 2 kernels; greedy (α = 1.0) stops at 4."""
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


def test_search_finds_two_kernels_through_the_worse_step(block):
    r = search(block, alpha=1.05, hw="h100", dtype="bf16")
    assert r.best_cost["kernels"] == 2
    assert abs(r.best_cost["time_us"] - 23.36) < 0.05
    rules = [s.rule for s in r.path]
    assert "enlarge_conv_kernel" in rules and rules[-1] == "merge_parallel_convs"
    i = rules.index("enlarge_conv_kernel")
    assert r.path[i].time_us > r.path[i - 1].time_us  # worse before better (§4.2 step ③)
    assert [op.name for op in ir.op_view(r.best)] == ["conv_bias", "relu"]
    assert r.explored <= 100


def test_greedy_stops_at_step_two(block):
    r = search(block, alpha=1.0, hw="h100", dtype="bf16")
    assert r.best_cost["kernels"] == 4
    assert [s.rule for s in r.path] == ["fold_conv_bn", "fold_conv_bn"]


def test_search_rejects_bad_settings(block):
    with pytest.raises(MlsysError, match="alpha"):
        search(block, alpha=0.5)
    with pytest.raises(MlsysError, match="unknown pass"):
        search(block, rules=["nope"])
    with pytest.raises(MlsysError, match="'dce'; choose from fold_conv_bn"):  # not a search move
        search(block, rules=["dce"])
    with pytest.raises(MlsysError, match="unknown hardware"):
        search(block, hw="tpu9")
