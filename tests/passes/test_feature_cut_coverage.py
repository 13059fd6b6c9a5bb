"""Every output feature of what a fold ships is covered by its validation on a cut
(passes/feature_cut.py ``coverage``). The hostile case: a fold rule broken only at feature 1000
of 1024, by 1e-5, only when it is handed the whole kernel. No cut of the features reads the
folded constant the program ships, so validating the sample (or every feature, cut by cut)
passes it, and optimize's value check (1e-4 relative) passes broken weights too; the constants
the rewrite ships, compared with the rule's own on cuts that cover every feature (two halves
here), do not — the region is then validated whole and the rewrite refused. A correct fold is kept, and says what was covered.
The kernels are small (128 KiB): the cut starts at 64 KiB here."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.passes import feature_cut, registry
from mlsys_jax.passes.rewrite import fold
from mlsys_jax.passes.rewrite.mutate import during
from mlsys_jax.passes.value_check import check_values
from tests.passes.cut_fixtures import float32_and_a_small_cut, normal_f32  # noqa: F401

CIN, COUT, BROKEN, OFF = 32, 1024, 1000, 1e-5
RNG = np.random.default_rng(0)


def _f32(shape, scale=1.0, offset=0.0):
    return normal_f32(RNG, shape, scale, offset)


def _bn(y):
    mean, beta = _f32((COUT,), 0.3), _f32((COUT,), 0.3)
    var, gamma = jnp.abs(_f32((COUT,), 1.0, 1.0)) + 0.1, _f32((COUT,), 0.3, 1.0)
    return (y - mean) * lax.rsqrt(var + 1e-5) * gamma + beta


def _conv_bn(batch: int = 1):
    w = _f32((1, 1, CIN, COUT), 0.1)
    x = _f32((batch, 3, 3, CIN))
    f = lambda x: _bn(lax.conv_general_dilated(  # noqa: E731
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")))
    return ir.trace(f, x), x, P.fold_conv_bn()


def _dense_bn():
    w, b = _f32((CIN, COUT), 0.1), _f32((COUT,), 0.1)
    x = _f32((4, CIN))
    return ir.trace(lambda x: _bn(x @ w + b), x), x, registry.make("fold_dense_bn")


def _broken_weights(real):
    """``real`` with folded weights of feature BROKEN scaled by 1 + OFF — when the rule is handed
    all COUT features (an index into the whole kernel): on any cut it is exact."""
    scale = fold.scale_weights

    def wrong(w, vec, site, dtype):
        out = np.array(scale(w, vec, site, dtype))
        axis = site.weight_axes[0]
        if out.shape[axis] == COUT:
            at = [slice(None)] * out.ndim
            at[axis] = BROKEN
            out[tuple(at)] = (out[tuple(at)].astype(np.float64) * (1 + OFF)).astype(out.dtype)
        return out
    return during(real, (fold, "scale_weights", wrong))


def _broken_shift(real):
    """``real`` with the folded shift of feature BROKEN off by OFF, on the whole kernel alone."""
    folded = fold.folded

    def wrong(em, site, aff):
        w, b = folded(em, site, aff)
        if not isinstance(b, jax.core.Tracer) and np.shape(b)[-1] == COUT:
            b = np.array(b)
            b[..., BROKEN] += OFF
        return w, b
    return during(real, (fold, "folded", wrong))


def _refusals(res):
    return [r.reason for r in res.refusals if r.check == "translation_validation"]


CASES = {"conv+BN weights": (_conv_bn, _broken_weights), "conv+BN shift": (_conv_bn, _broken_shift),
         "dense+BN weights": (_dense_bn, _broken_weights),
         # a batch large enough that the region is validated whole on one example of it
         "conv+BN weights, 128 examples": (lambda: _conv_bn(batch=128), _broken_weights)}


@pytest.mark.parametrize("case", CASES)
def test_a_fold_broken_at_one_high_feature_is_refused(case):
    make, breaking = CASES[case]
    closed, x, real = make()
    broken = breaking(real)
    unchecked = P.run(broken, closed, validate=False)
    diff = np.abs(np.asarray(ir.interpret(unchecked.jaxpr, x)[0], np.float64)
                  - np.asarray(ir.interpret(P.run(real, closed).jaxpr, x)[0], np.float64))
    assert diff[..., BROKEN].max() > 0 and np.delete(diff, BROKEN, axis=-1).max() == 0
    if case in ("conv+BN weights", "dense+BN weights"):  # within the value check's 1e-4 here
        assert check_values(closed, unchecked.jaxpr, [x]).verdict == "yes"
    res = P.run(broken, closed)
    (why,) = _refusals(res)
    assert not res.changed and not res.rewrites
    assert f"differs from the rule's own on a cut (output features 512-1023 of {COUT}) at " \
           f"feature(s) {BROKEN}: " in why
    assert "; validated whole: output 0 differs in float64" in why


@pytest.mark.parametrize("make", [_conv_bn, _dense_bn])
def test_a_correct_fold_is_kept_and_says_every_feature_was_covered(make):
    closed, x, real = make()
    res = P.run(real, closed)
    (fired,) = res.rewrites
    assert not _refusals(res)
    assert fired.detail.endswith(f"the constants it ships at all {COUT} (2 cuts of 512))")
    assert check_values(closed, res.jaxpr, [x]).verdict == "yes"


def test_the_cuts_cover_every_feature_one_length(monkeypatch):
    closed, _, real = _conv_bn()
    from mlsys_jax.passes.rewrite.level import Level
    from mlsys_jax.passes.rules import fold_conv_bn as rule
    level = Level(closed)
    (m,) = [x for x in rule.match(level) if not isinstance(x, rule.Refused)]
    region = rule.RULE.region(level, m)
    cut = feature_cut.choose(region.site)
    for size, per_cut in ((COUT, 512), (1000, 500), (999, 333), (65, 64)):  # 999: 3 even cuts
        cuts = feature_cut.windows(feature_cut.Cut(cut.site, cut.axis, cut.keep, size))
        assert {len(w.keep) for w in cuts} == {per_cut}  # at most half: each is a cut
        assert set(np.concatenate([w.keep for w in cuts]).tolist()) == set(range(size))
    monkeypatch.setattr(feature_cut, "WINDOW_BYTES", 1 << 13)  # 8 KiB: 64 features of 128 B a cut
    assert [int(w.keep[0]) for w in feature_cut.windows(cut)] == list(range(0, COUT, 64))
    assert feature_cut.coverage(region, rule.RULE.replacement(level, m), cut) is None
