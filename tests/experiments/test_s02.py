"""Experiment 02 (§4): every lecture claim holds on the computed data, and specific values."""
from __future__ import annotations

import pytest

from experiments import s02_graph_opt as s02
from tests.experiments.terminal import assert_fits_a_terminal


@pytest.fixture(scope="module")
def result():
    return s02.run(timing_shape=(2, 64, 28, 28), repeats=3)


@pytest.mark.slow
def test_all_checks_pass(result):
    failed = [c for c in s02.check(result) if not c.ok]
    assert not failed, failed


def test_five_step_values(result):
    rows = result.data["steps"]
    assert [r["kernels"] for r in rows] == [6, 4, 4, 4, 2, 2]
    assert round(rows[0]["time_us"], 2) == 73.87 and round(rows[-1]["time_us"], 2) == 23.36
    assert round(rows[3]["gflops"], 2) == 14.82
    assert rows[-1]["ops"] == "conv_bias relu"
    assert max(r["max_abs_diff_f64"] for r in rows) < 1e-13
    assert round(result.data["speedup"], 2) == 3.16


def test_demo3_and_exercises(result):
    train, relu, linear = result.data["demo3"]["rows"]
    assert "'mean'" in train["reason"] and train["forced_error"] > 1
    assert "relu" in relu["reason"] and relu["forced_error"] > 1
    assert linear["forced_error"] < 1e-12
    ex = result.data["exercises"]
    assert ex["s"] == pytest.approx(1.0, abs=1e-12) and ex["b"] == pytest.approx(-0.5, abs=1e-12)
    assert ex["enlarged_gflops"] == pytest.approx(9 * ex["conv1x1_gflops"])


def test_search_paths(result):
    s, g = result.data["search"]["search"], result.data["search"]["greedy"]
    assert s["rules"] == ["fold_conv_bn", "fold_conv_bn", "enlarge_conv_kernel",
                          "merge_parallel_convs"]
    assert g["rules"] == ["fold_conv_bn", "fold_conv_bn"]


def test_bad_override_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown setting"):
        s02.run(nope=1)


def test_bad_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="4 positive ints"):
        s02.run(small_shape=(2, 8, 10))


def test_printed_report_fits_a_terminal(result):
    assert_fits_a_terminal(result, s02.check(result))
