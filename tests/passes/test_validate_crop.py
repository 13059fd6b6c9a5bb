"""A conv region validated on a crop of its image (ir/rebatch.py, passes/validate.py): the crop
keeps every border type of the full image, each side crops the convs of one image (parallel convs
of it, not a chain), all with one geometry; anything else is refused the crop and validated on
more."""
from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir
from mlsys_jax.ir import rebatch
from mlsys_jax.ir.evaluate import eval_equation
from mlsys_jax.ir.rebatch import Unshrinkable, border_types, crop_length, rebind
from mlsys_jax.passes import validate as V

NHWC = ("NHWC", "HWIO", "NHWC")


def test_a_crop_meets_every_border_type_aligned_to_the_stride():
    for n, kernel, stride, lo, hi, dilation in itertools.product(
            (1, 2, 5, 9, 56, 57, 224), (1, 3, 7), (1, 2, 3), (0, 1, 3), (0, 1, 2), (1, 2)):
        geometry = dict(kernel=kernel, stride=stride, padding=(lo, hi), dilation=dilation)
        full = set(border_types(n, **geometry))
        m = crop_length(n, **geometry)
        assert 0 < m <= n and (n - m) % stride == 0, (n, geometry)
        assert set(border_types(m, **geometry)) >= full, (n, geometry)
        # the fewest: no shorter aligned crop meets them all
        assert all(not set(border_types(k, **geometry)) >= full
                   for k in range(m - stride, 0, -stride)), (n, geometry)


def test_border_types_by_hand():
    # 7x7, stride 2, padding 3 on 224 (a ResNet stem): 3 taps, then 1, on the low padding,
    # 2 on the high at the last position; 8 pixels meet all four
    types = border_types(224, kernel=7, stride=2, padding=(3, 3), dilation=1)
    assert sorted(set(types)) == [(0, 0), (0, 2), (1, 0), (3, 0)]
    assert crop_length(224, kernel=7, stride=2, padding=(3, 3), dilation=1) == 8
    assert crop_length(56, kernel=1, stride=1, padding=(0, 0), dilation=1) == 1


def _conv_eqn(padding=((1, 1), (1, 1)), strides=(1, 1), x_shape=(1, 9, 9, 4)):
    x, w = np.ones(x_shape, np.float32), np.ones((3, 3, 4, 4), np.float32)
    (eqn,) = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
        x, w, strides, padding, dimension_numbers=NHWC))(x, w).jaxpr.eqns
    return eqn, w


def _bind(e, a):
    return eval_equation(e, a)


def test_a_conv_on_a_crop_computes_the_full_images_border_and_interior_positions():
    eqn, _ = _conv_eqn()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 9, 9, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 4)).astype(np.float32)
    crop = x[:, :3, :3]
    with rebatch.cropping(), rebatch.side():
        (got,) = rebind(eqn, [crop, w], _bind)
    full = np.asarray(eval_equation(eqn, [x, w])[0])
    # the crop's corner is the full image's corner, its middle an interior position
    np.testing.assert_allclose(np.asarray(got)[0, :2, :2], full[0, :2, :2], rtol=1e-6)


def test_a_crop_is_refused_outside_validation_short_of_a_border_type_or_off_the_stride():
    eqn, w = _conv_eqn()
    x = np.ones((1, 9, 9, 4), np.float32)
    with pytest.raises(Unshrinkable, match="other than its batch"):
        rebind(eqn, [x[:, :3, :3], w], _bind)  # no validation around it
    with rebatch.cropping(), rebatch.side(), pytest.raises(Unshrinkable, match="border type"):
        rebind(eqn, [x[:, :2, :2], w], _bind)  # no interior position
    strided, w = _conv_eqn(strides=(2, 2))
    with rebatch.cropping(), rebatch.side(), pytest.raises(Unshrinkable, match="border type"):
        rebind(strided, [x[:, :4, :4], w], _bind)  # 9 - 4 is odd: the far edge moved


def test_each_side_crops_the_convs_of_one_image_and_both_sides_one_geometry():
    eqn, w = _conv_eqn()
    x = np.ones((1, 3, 3, 4), np.float32)
    with rebatch.cropping():
        with rebatch.side():
            (y,) = rebind(eqn, [x, w], _bind)
            rebind(eqn, [x, w * 2], _bind)  # a parallel conv of the same image
            with pytest.raises(Unshrinkable, match="second cropped conv"):
                rebind(eqn, [np.asarray(y), w], _bind)  # a chain: borders of borders
            with pytest.raises(Unshrinkable, match="second cropped conv"):
                rebind(eqn, [x.copy(), w], _bind)  # equal, but not the image cropped
            wide, _ = _conv_eqn(padding=((2, 2), (2, 2)))
            with pytest.raises(Unshrinkable, match="different geometry"):
                rebind(wide, [x, w], _bind)  # the same image, another padding
        with rebatch.side():
            rebind(eqn, [x, w], _bind)  # the other side, the same geometry
        other, w = _conv_eqn(padding=((2, 0), (1, 1)))
        with rebatch.side(), pytest.raises(Unshrinkable, match="different geometry"):
            rebind(other, [x, w], _bind)


def _region(fn, shape):
    from mlsys_jax.passes.rewrite.level import Level
    from mlsys_jax.passes.rules import fold_conv_bn

    with jax.enable_x64(False):
        level = Level(ir.trace(fn, jax.ShapeDtypeStruct(shape, jnp.float32)))
    (m,) = [x for x in fold_conv_bn.match(level) if not isinstance(x, fold_conv_bn.Refused)]
    return fold_conv_bn.RULE.region(level, m), fold_conv_bn.RULE.replacement(level, m)


def _conv_scaled(padding="SAME", strides=(1, 1)):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 3, 8, 8)) / 8, jnp.float32)
    s = jnp.asarray(np.linspace(0.5, 2.0, 8), jnp.float32)
    return lambda x: lax.conv_general_dilated(x, w, strides, padding,
                                              dimension_numbers=NHWC) * s


@pytest.mark.parametrize("padding,strides,crop", [("SAME", (1, 1), (1, 3, 3, 8)),
                                                  ("VALID", (1, 1), (1, 3, 3, 8)),
                                                  ("SAME", (2, 2), (1, 4, 4, 8))])
def test_a_conv_fold_is_validated_on_a_crop_and_a_wrong_one_refused_there(padding, strides,
                                                                          crop):
    region, right = _region(_conv_scaled(padding, strides), (4, 32, 32, 8))
    assert V._cropped(region) == [crop]
    assert V.validate(region, right) is None
    assert V._validate(region, right, [crop]) is None  # the crop itself, not a fallback

    def wrong(read, widen):
        return {k: v * 1.5 for k, v in right(read, widen).items()}
    assert "differs in float64" in V._validate(region, wrong, [crop])
    assert "differs in float64" in V.validate(region, wrong)


def test_a_replacement_of_another_geometry_is_validated_on_more_than_the_crop():
    """The replacement binds the conv with another padding: the crop would pair the two
    paddings' border types differently from the full image, so it is refused and the region
    validated on a whole example, where the rewrite is wrong."""
    region, right = _region(_conv_scaled(), (4, 32, 32, 8))
    conv = next(e for e in region.eqns if e.primitive.name == "conv_general_dilated")
    crop = V._cropped(region)

    def shifted(read, widen):
        x, w = read(region.inputs[0]), np.asarray(region.consts[conv.invars[1]])
        other = conv.replace(params={**conv.params, "padding": ((2, 0), (1, 1))})
        with jax.enable_x64(widen):
            (y,) = rebind(other, [x, w.astype(np.float64) if widen else w],
                          partial(V.approximate, widen=widen))
        return {region.outputs[0]: np.asarray(y) * np.linspace(0.5, 2.0, 8)}
    with pytest.raises(Unshrinkable, match="different geometry"):
        V._validate(region, shifted, crop)
    assert "differs in float64" in V.validate(region, shifted)


@pytest.mark.parametrize("name", ["conv_bn_wrong_channel_axis", "conv_bn_no_eps"])
def test_a_broken_fold_is_refused_on_the_crop(name, monkeypatch):
    """The fuzzer's broken Conv+BN folds on a 64×64 image: the first attempt that runs is the
    crop, and it refuses them with the measured reason."""
    from mlsys_jax import passes as P
    from mlsys_jax.fuzz import mutants
    from tests.passes.test_validate import CASES
    from tests.passes.conv_cases import rand

    program, _ = CASES[name]
    closed = ir.trace(program, rand(7, (2, 4, 64, 64)))
    ran = []
    validate = V._validate

    def spy(region, replacement, shapes, cut=None):
        why = validate(region, replacement, shapes, cut)
        ran.append((shapes, V._cropped(region), why))
        return why
    monkeypatch.setattr(V, "_validate", spy)
    mutant = next(m for m in mutants.MUTANTS if m.name == name)
    checked = P.run(mutant.make(), closed)
    refused = [r for r in checked.refusals if r.check == "translation_validation"]
    assert refused and "differs in float64" in refused[0].reason
    shapes, crop, why = ran[0]
    assert shapes == crop == [(1, 4, 3, 3)] and why is not None


def test_parallel_convs_merged_are_validated_on_one_crop_and_a_wrong_merge_refused_there():
    from mlsys_jax.passes.rewrite.level import Level
    from mlsys_jax.passes.rules import merge_parallel_convs as rule

    rng = np.random.default_rng(0)
    w1, w2 = (jnp.asarray(rng.standard_normal((1, 1, 8, n)) / 3, jnp.float32) for n in (8, 16))

    def f(x):
        conv = partial(lax.conv_general_dilated, window_strides=(1, 1), padding="VALID",
                       dimension_numbers=NHWC)
        return conv(x, w1) * 2.0, conv(x, w2) - 1.0
    with jax.enable_x64(False):
        level = Level(ir.trace(f, jax.ShapeDtypeStruct((2, 64, 64, 8), jnp.float32)))
    (m,) = [x for x in rule.match(level) if not isinstance(x, rule.Refused)]
    region, right = rule.RULE.region(level, m), rule.RULE.replacement(level, m)
    assert sum(e.primitive.name == "conv_general_dilated" for e in region.eqns) == 2
    crop = V._cropped(region)
    assert crop == [(1, 1, 1, 8)]
    assert V._validate(region, right, crop) is None  # both convs of the region cropped

    def wrong(read, widen):
        outs = right(read, widen)
        first = region.outputs[0]
        return {**outs, first: np.asarray(outs[first]) * (1 + 1e-3)}
    assert "differs in float64" in V._validate(region, wrong, crop)


def test_a_large_conv_on_a_small_image_is_cropped_all_the_same():
    """ResNet-50's last stage: 7×7 pixels, too few to count as a large input, but a 3×3×512×512
    kernel; the conv's work (``CROP_MACS``) decides the crop."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 3, 64, 256)) / 24, jnp.float32)
    s = jnp.asarray(np.linspace(0.5, 2.0, 256), jnp.float32)
    conv = partial(lax.conv_general_dilated, window_strides=(1, 1), padding="SAME",
                   dimension_numbers=NHWC)
    region, right = _region(lambda x: conv(x, w) * s, (1, 9, 9, 64))
    assert not V._large([tuple(v.aval.shape) for v in region.inputs])
    assert V._cropped(region) == [(1, 3, 3, 64)]
    assert V.validate(region, right) is None
    small, _ = _region(lambda x: conv(x, w[..., :8]) * s[:8], (1, 9, 9, 64))
    assert V._cropped(small) is None  # a small conv on a small image runs whole
