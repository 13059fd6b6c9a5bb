"""A NaN or Inf that one computation has and the other does not is a difference no later max
can lose (``shard.compare``): the leaf's difference is Inf, whichever leaf it is, and the verdict
is not within its bound; the same NaN or Inf on both sides is no difference; the magnitude a
floor is scaled by counts finite elements only. ``remat`` compares its gradients the same way."""
from __future__ import annotations

import numpy as np
import pytest

from mlsys_jax.parallel.shard.compare import Judgement, leaf_diffs, leaf_rms_diffs, leaf_scales
from mlsys_jax.remat.planner.programs import grad_difference

GOOD = np.ones(4, np.float32)
HELD = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)


@pytest.mark.parametrize("other", [np.array([1.0, 2.0, np.inf, -np.inf], np.float32),
                                   np.array([1.0, np.nan, -np.inf, -np.inf], np.float32),
                                   np.array([1.0, np.nan, 7.0, -np.inf], np.float32)])
@pytest.mark.parametrize("first", [True, False])
def test_a_nonfinite_value_on_one_side_is_never_within(other, first):
    a, b = [GOOD, HELD], [GOOD, other]
    if first:
        a, b = a[::-1], b[::-1]
    diffs = leaf_diffs(a, b)
    assert np.inf in diffs and not any(np.isnan(diffs))
    j = Judgement()
    j.add(diffs, [0.0, 0.0], leaf_scales(b), 1e-7)
    assert not j.within and j.diff == np.inf
    assert grad_difference(a, b)[0] == np.inf


def test_the_same_nonfinite_values_on_both_sides_are_no_difference():
    big = np.ones(200_000)
    big[150_000] = np.nan  # in the third block compared
    assert leaf_diffs([GOOD, HELD, big], [GOOD, HELD.copy(), big.copy()]) == [0.0, 0.0, 0.0]
    assert leaf_rms_diffs([HELD], [HELD.copy()]) == [0.0]
    assert leaf_scales([HELD, big]) == [1.0, 1.0]  # the finite elements' magnitude
    j = Judgement()
    j.add(leaf_diffs([GOOD, HELD], [GOOD, HELD]), [0.0, 0.0], leaf_scales([GOOD, HELD]), 1e-7)
    assert j.within
    assert grad_difference([GOOD * 1.5], [GOOD]) == (0.5, 0.5)


def test_recorded_runs_and_the_lecture_keep_a_nan_in_a_later_leaf(tmp_path):
    """Two processes' recordings compared file by file, and the lecture's max |Δ| over leaves:
    a NaN in the second leaf is not lost to Python's max."""
    from mlsys_jax.parallel.lecture.data import max_abs_diff
    from mlsys_jax.parallel.shard.run import compare_recorded

    for name, leaves in (("a", [GOOD, GOOD]), ("b", [GOOD, HELD])):
        where = tmp_path / name / "forced" / "0" / "grads"
        where.mkdir(parents=True)
        for k, leaf in enumerate(leaves):
            np.save(where / f"{k}.npy", leaf)
    assert compare_recorded(str(tmp_path / "a"), str(tmp_path / "b")) == {
        "forced": {"grads": np.inf}}
    assert np.isnan(max_abs_diff([GOOD, HELD], [GOOD, GOOD]))


def test_the_pipeline_verdict_is_never_within_on_a_nonfinite_difference():
    from mlsys_jax.parallel.pipe.verdict import PipelineVerdict

    for diffs, bounds in (([0.0, np.inf], [1.0, np.inf]), ([np.nan, 0.0], [1.0, 1.0]),
                          ([0.0, np.nan], [1.0, 1.0])):
        v = PipelineVerdict()
        v.record("grads", diffs, [0.0, 0.0], bounds)
        assert not v.within("grads")
    v = PipelineVerdict()
    v.record("grads", [0.0, 0.5], [0.0, 0.0], [1.0, 1.0])
    assert v.within("grads")
