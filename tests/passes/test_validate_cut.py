"""Translation validation on a cut of a site's output features (passes/feature_cut.py): a fold of
large weights is validated on the first two, the last two and a seeded sample of its output
features, and says so; a rule broken on its last channel, or on a channel the cut does not keep,
is refused: the constants it ships are compared with the rule's own on every cut
(feature_cut.coverage), and differing there the region is validated whole; where the features cannot be cut (a grouped
conv, a region that contracts them, a replacement that does not read the cut) validation runs
whole. This file's kernels are small: the cut starts at 64 KiB here."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.passes.rewrite.mutate import during as _during
from mlsys_jax.passes import feature_cut, registry, validate as V
from mlsys_jax.passes.rules import fold_conv_bn as rule
from mlsys_jax.passes.rewrite import fold
from mlsys_jax.passes.rewrite.level import Level
from mlsys_jax.passes.value_check import check_values
from tests.passes.cut_fixtures import float32_and_a_small_cut, normal_f32  # noqa: F401

CIN, COUT = 32, 1024  # a 128 KiB float32 kernel
RNG = np.random.default_rng(0)
NOT_KEPT = next(j for j in range(COUT) if j not in set(feature_cut.keep(COUT).tolist()))


def _f32(shape, scale=1.0, offset=0.0):
    return normal_f32(RNG, shape, scale, offset)


def _conv_bn(groups=1):
    w = _f32((1, 1, CIN, COUT), 0.1)
    mean, beta = _f32((COUT,), 0.3), _f32((COUT,), 0.3)
    var, gamma = jnp.abs(_f32((COUT,), 1.0, 1.0)) + 0.1, _f32((COUT,), 0.3, 1.0)

    def f(x):
        y = lax.conv_general_dilated(x, w, (1, 1), "VALID", feature_group_count=groups,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (y - mean) * lax.rsqrt(var + 1e-5) * gamma + beta
    x = _f32((1, 3, 3, CIN * groups))
    return ir.trace(f, x), x


def _mis_scaling(real_pass, channel):
    """``real_pass`` with the folded weights of output channel ``channel(n)`` (n: how many the
    rule is given) scaled by 1.5 — a rule broken on one channel."""
    real = fold.scale_weights

    def wrong(w, vec, site, dtype):
        out = np.array(real(w, vec, site, dtype))
        at = [slice(None)] * out.ndim
        at[site.weight_axes[0]] = channel(out.shape[site.weight_axes[0]])
        out[tuple(at)] *= 1.5
        return out
    return _during(real_pass, (fold, "scale_weights", wrong))


def _outputs(closed, x):
    return np.asarray(ir.interpret(closed, x)[0], np.float64)


def _translation_refusals(res):
    return [r.reason for r in res.refusals if r.check == "translation_validation"]


def test_a_large_fold_is_validated_on_a_cut_and_says_so():
    closed, x = _conv_bn()
    res = P.run(P.fold_conv_bn(), closed)
    (fired,) = res.rewrites
    assert fired.detail.endswith(f"(translation validation on 64 of its {COUT} output features "
                                 f"(the first 2, the last 2 and 60 drawn with seed {COUT}), the "
                                 f"constants it ships at all {COUT} (2 cuts of 512))")
    want = _outputs(closed, x)
    assert np.abs(_outputs(res.jaxpr, x) - want).max() <= 1e-5 * (1 + np.abs(want).max())


def test_the_cut_catches_a_rule_broken_on_its_last_output_channel():
    closed, x = _conv_bn()
    broken = _mis_scaling(P.fold_conv_bn(), lambda n: n - 1)
    unchecked = P.run(broken, closed, validate=False)
    diff = np.abs(_outputs(unchecked.jaxpr, x) - _outputs(closed, x))
    assert diff[..., -1].min() > 1e-3 and diff[..., :-1].max() < 1e-4  # that channel alone
    res = P.run(broken, closed)
    assert not res.changed
    (why,) = _translation_refusals(res)
    # the last feature of each cut is not the last of the whole: the constants differ on cuts
    assert why.startswith("translation validation: the constant float32[1, 1, 32, 1024]")
    assert "(output features 0-511 of 1024) at feature(s) 511:" in why
    assert "; validated whole: output 0 differs in float64" in why


def test_a_channel_the_cut_does_not_keep_is_still_refused():
    """A rule broken on a channel it names by its index in the whole kernel: no cut holds that
    channel's folded weights, but the constants the rewrite ships are compared with the rule's
    own on every cut (feature_cut.coverage), so the region is validated whole and refused;
    applied unvalidated, optimize's value check, which compares every element, finds it too."""
    closed, x = _conv_bn()
    broken = _mis_scaling(P.fold_conv_bn(), lambda n: NOT_KEPT if n == COUT else slice(0, 0))
    res = P.run(broken, closed)
    (why,) = _translation_refusals(res)
    assert not res.changed and f"at feature(s) {NOT_KEPT}:" in why
    assert why.startswith("translation validation: the constant float32[1, 1, 32, 1024]")
    assert "; validated whole: output 0 differs in float64" in why
    check = check_values(closed, P.run(broken, closed, validate=False).jaxpr, [x])
    assert check.verdict == "no" and check.wrong >= 9  # channel NOT_KEPT at each of 3×3 pixels


def test_a_grouped_conv_is_validated_whole():
    closed, x = _conv_bn(groups=2)
    res = P.run(P.fold_conv_bn(), closed)
    assert res.changed and "output features" not in res.rewrites[0].detail
    broken = P.run(_mis_scaling(P.fold_conv_bn(), lambda n: n - 1), closed)
    (why,) = _translation_refusals(broken)
    assert not broken.changed and why.startswith("translation validation: output 0 differs")


def test_a_region_that_contracts_the_features_is_validated_whole():
    """Attention's scale folded into a large query projection: the scores matmul sums over the
    projection's features, so no cut of them computes what the region does at those features."""
    wq, wk = _f32((CIN, COUT), 0.1), _f32((CIN, COUT), 0.1)
    closed = ir.trace(lambda x: ((x @ wq) @ (x @ wk).T) * 0.125,
                      jax.ShapeDtypeStruct((4, CIN), jnp.float32))
    res = P.run(registry.make("fold_matmul_scale"), closed)
    assert res.changed and "output features" not in res.rewrites[0].detail
    broken = P.run(_mis_scaling(registry.make("fold_matmul_scale"), lambda n: n - 1), closed)
    (why,) = _translation_refusals(broken)
    assert not broken.changed and why.startswith("translation validation: output 0 differs")


def test_a_replacement_that_does_not_read_the_cut_is_validated_whole():
    closed, _ = _conv_bn()
    level = Level(closed)
    (m,) = [x for x in rule.match(level) if not isinstance(x, rule.Refused)]
    region, right = rule.RULE.region(level, m), rule.RULE.replacement(level, m)
    assert feature_cut.choose(region.site) is not None
    assert V.check(region, right)[1] is not None  # the rule's own replacement: on the cut
    blind = lambda read, widen, cut=None: right(read, widen)  # noqa: E731 (ignores the cut)
    assert V.check(region, blind) == (None, None)

    def wrong(read, widen, cut=None):  # ignores the cut too, and scales everything
        return {k: v * 1.5 for k, v in right(read, widen).items()}
    why, scope = V.check(region, wrong)
    assert scope is None and why.startswith("output 0 differs in float64")


def test_the_kept_features_are_both_ends_and_a_seeded_sample():
    kept = feature_cut.keep(COUT)
    assert len(kept) == feature_cut.KEEP and list(kept) == sorted(set(kept.tolist()))
    assert {0, 1, COUT - 2, COUT - 1} <= set(kept.tolist())
    assert np.array_equal(kept, feature_cut.keep(COUT))            # the same cut every time
    assert not np.array_equal(kept, feature_cut.keep(COUT + 1)[:feature_cut.KEEP])
