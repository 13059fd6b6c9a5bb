"""Experiment 02 (§4): every lecture claim holds on the computed data, and the figures are what
the cost model makes of the graphs the passes produce."""
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
    """Each step's figures are its kernels' (the roofline model, summed), within the lecture's
    tolerance of the lecture's own figures."""
    rows = result.data["steps"]
    assert [r["kernels"] for r in rows] == list(s02.LECTURE["kernels"])
    for r, kernels, us in zip(rows, result.data["step_kernels"], s02.LECTURE["time_us"]):
        assert r["kernels"] == len(kernels)
        assert r["time_us"] == pytest.approx(sum(k["time_us"] for k in kernels), rel=1e-9)
        assert r["gflops"] == pytest.approx(sum(k["flops"] for k in kernels) / 1e9, rel=1e-9)
        assert abs(r["time_us"] - us) <= s02.US_TOL
    assert rows[-1]["ops"] == "conv_bias relu"
    assert max(r["max_abs_diff_f64"] for r in rows) < 1e-13
    assert result.data["speedup"] == pytest.approx(rows[0]["time_us"] / rows[-1]["time_us"])


def test_demo3_and_exercises(result):
    train, relu, linear = result.data["demo3"]["rows"]
    assert "'mean'" in train["reason"] and train["forced_error"] > 1
    assert "relu" in relu["reason"] and relu["forced_error"] > 1
    assert linear["forced_error"] < 1e-12
    ex = result.data["exercises"]
    assert ex["s"] == pytest.approx(1.0, abs=1e-12) and ex["b"] == pytest.approx(-0.5, abs=1e-12)
    assert ex["enlarged_gflops"] == pytest.approx(9 * ex["conv1x1_gflops"])


def test_search_paths(result):
    """The search folds both BatchNorms, passes through step ③ and ends by merging; greedy
    never takes the worse step."""
    s, g = result.data["search"]["search"], result.data["search"]["greedy"]
    assert s["rules"].count("fold_conv_bn") == 2 and s["rules"][-1] == "merge_parallel_convs"
    assert "enlarge_conv_kernel" in s["rules"][:-1] and s["kernels"] == 2
    assert "enlarge_conv_kernel" not in g["rules"] and g["kernels"] == 4


def test_bad_override_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown setting"):
        s02.run(nope=1)


def test_bad_shape_is_a_clear_error():
    with pytest.raises(ValueError, match="4 positive ints"):
        s02.run(small_shape=(2, 8, 10))


def test_printed_report_fits_a_terminal(result):
    assert_fits_a_terminal(result, s02.check(result))
