"""The bounds of leaves computed in bfloat16 (``shard``'s ``compare.Judgement`` and the
pipeline's ``verdict.judge_step``), on constructed values: a result that differs from the
reference by bfloat16 rounding alone (a few elements one ulp off, as much as an equivalent
computation) is within; the same result scaled by 1.01 is not, though 1% is one or two bfloat16
ulps at every element."""
import ml_dtypes
import numpy as np
import pytest

from mlsys_jax.ir.precision import ulp
from mlsys_jax.parallel.pipe.verdict import NarrowLeaves as PipeNarrow
from mlsys_jax.parallel.pipe.verdict import PipelineVerdict, judge_step
from mlsys_jax.parallel.shard.compare import EPS32, Judgement, Narrow, holds_only, \
    leaf_diffs, leaf_rms_diffs, leaf_rms_scales, leaf_scales

BF16 = ml_dtypes.bfloat16


def _bf16(x):
    """float32 values that are bfloat16 numbers (a float32 gradient of a bfloat16 matmul)."""
    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _flipped(x, count, seed):
    """``x`` with ``count`` elements moved one bfloat16 ulp: rounding, not a wrong result."""
    out = x.copy().reshape(-1)
    at = np.random.default_rng(seed).choice(out.size, count, replace=False)
    out[at] += np.asarray([np.spacing(np.asarray(abs(v), BF16)) for v in out[at]], np.float32)
    return out.reshape(x.shape)


@pytest.fixture
def leaves():
    ref = {"w": _bf16(np.random.default_rng(0).standard_normal((64, 32)) * 0.1)}
    return ref, {"w": _flipped(ref["w"], 300, 1)}      # an equivalent computation's rounding


def _judged(result, ref, twin, reductions=2):
    narrow = Narrow(["bfloat16"], leaf_rms_diffs(result, ref), leaf_rms_diffs(ref, twin),
                    [ref["w"].size], [ulp("bfloat16", s) for s in leaf_scales(ref)],
                    [ulp("bfloat16", s) for s in leaf_rms_scales(ref)], reductions)
    j = Judgement()
    j.add(leaf_diffs(result, ref), leaf_diffs(ref, twin), leaf_scales(ref), EPS32, narrow)
    return j


def test_rounding_in_bfloat16_is_within_its_measured_bound(leaves):
    ref, twin = leaves
    j = _judged({"w": _flipped(ref["w"], 300, 2)}, ref, twin)
    assert j.within and j.dtype == "bfloat16" and j.narrow == {"bfloat16"}
    assert holds_only(ref["w"], BF16) and not holds_only(ref["w"] / 3, BF16)


def test_a_gradient_scaled_by_1_01_in_bfloat16_is_caught(leaves):
    ref, twin = leaves
    scaled = {"w": _flipped(ref["w"], 300, 2) * np.float32(1.01)}
    j = _judged(scaled, ref, twin)
    assert not j.within and j.rule == "rms", (j.ratio, j.rule)
    # the largest element alone could not tell: 1% is within a couple of bfloat16 ulps
    max_bound = (2 * leaf_diffs(ref, twin)[0] + 16 * EPS32 * leaf_scales(ref)[0]
                 + 2 * ulp("bfloat16", leaf_scales(ref)[0]))
    assert leaf_diffs(scaled, ref)[0] <= max_bound


def test_float32_leaves_keep_the_plain_rule(leaves):
    ref, twin = leaves
    j = Judgement()
    j.add(leaf_diffs(twin, ref), leaf_diffs(ref, twin), leaf_scales(ref), EPS32)
    assert j.within and j.dtype is None and j.rule == "max"
    assert j.bound == pytest.approx(2 * leaf_diffs(ref, twin)[0] + 16 * EPS32 * leaf_scales(ref)[0])


def _refs(a, b, c):
    out = {k: (np.float32(2.5), g, g, None) for k, g in zip("ABC", (a, b, c))}
    out["terms"] = (np.float32(2.5), {k: np.float32(np.abs(v).max()) for k, v in a.items()})
    return out


@pytest.mark.parametrize("factor, within", [(1.0, True), (1.01, False)])
def test_the_pipeline_bounds_bfloat16_leaves_the_same_way(leaves, factor, within):
    ref, twin = leaves
    refs = _refs(ref, {"w": _flipped(ref["w"], 300, 3)}, twin)
    got = {"w": _flipped(ref["w"], 300, 4) * np.float32(factor)}
    v = PipelineVerdict()
    separable = judge_step(v, refs, {"loss": np.float32(2.5), "grads": got, "params": got},
                           lambda g: g, PipeNarrow(("bfloat16",), ("bfloat16",), 4))
    assert separable and bool(v.within("grads")) is within, v.worst["grads"]
