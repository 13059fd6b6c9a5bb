"""Experiment 01: graph vs tape AD, partial execution, CSE, fusion, control flow, graph breaks."""
import pytest

import experiments.s01_autodiff as s01
from mlsys_jax.errors import MlsysError
from mlsys_jax.results import OverrideError
from tests.experiments.terminal import assert_fits_a_terminal


@pytest.fixture(scope="module")
def result():
    return s01.run(steps=5)


@pytest.mark.slow
def test_every_claim_holds(result):
    checks = s01.check(result)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    assert len(checks) >= 16


def test_lecture_figures(result):
    t = result.tables
    nodes = {r["graph"]: r for r in t["demo1_nodes"]}
    assert (nodes["forward"]["ops"], nodes["forward"]["nodes"]) == (6, 12)
    assert [r["ops"] for r in t["demo1_ops_per_step"][:3]] == [20, 19, 20]
    assert [r["ops"] for r in t["demo2_partial_cse"]] == [6, 9, 8]
    assert [(r["kernels"], round(r["time_us"], 1)) for r in t["demo2_fusion_h100"]] == [(6, 31.1), (4, 22.0)]
    ctrl = {r["control flow"]: r for r in t["demo3_control_flow"]}
    assert (ctrl["where"]["ops"], ctrl["where"]["branches_run"], ctrl["cond"]["branches_run"]) == (5, 2, 1)
    ex = {r["function"]: r for r in t["demo4_explain"]}
    assert ex["branchy, h.sum() > 0"]["ops_per_graph"] == "matmul relu sum gt | mul"
    assert ex["branchy, h.sum() == 0"]["ops_per_graph"] == "matmul relu sum gt | exp"


def test_losses_equal_across_modes(result):
    losses = result.data["losses"]
    assert len(losses["graph"]) == 5 and losses["graph"] == losses["tape"]
    assert losses["graph"][-1] < losses["graph"][0]
    assert result.data["equality"]["graph_vs_tape_bitwise"]


def test_bad_setting():
    with pytest.raises(OverrideError):
        s01.run(stepz=3)
    with pytest.raises(MlsysError, match="steps must be"):
        s01.run(steps=0)


def test_printed_report_fits_a_terminal(result):
    assert_fits_a_terminal(result, s01.check(result))
