"""The conv rewrites of §4: fold_conv_bn, merge_parallel_convs, enlarge_conv_kernel."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, models, passes as P
from mlsys_jax.passes.convsites import attribute_difference, find_sites

F64 = jnp.float64
def _block_params(c):
    bn = lambda k: {n: v for n, v in _bn(c, k).items()}  # noqa: E731
    return {"w3": _kernel("NCHW", c, c, 3, 11), "w1": _kernel("NCHW", c, c, 1, 12),
            "bn3": bn(20), "bn1": bn(30)}


LAYOUTS = {"NCHW": ("NCHW", "OIHW", "NCHW"), "NHWC": ("NHWC", "HWIO", "NHWC")}


def _rand(key, shape, dtype=F64, scale=1.0):  # NumPy: no compile per shape
    return jnp.asarray(scale * np.random.default_rng(key).standard_normal(shape), dtype)


def _kernel(layout, o, i, k, key=1):
    shape = (o, i, k, k) if layout == "NCHW" else (k, k, i, o)
    return _rand(key, shape, scale=0.3)


def _x(layout, n=2, c=4, h=9):
    return _rand(7, (n, c, h, h) if layout == "NCHW" else (n, h, h, c))


def _bn(c, key=3):
    return {"gamma": 1 + _rand(key, (c,), scale=0.3), "beta": _rand(key + 1, (c,), scale=0.3),
            "mean": _rand(key + 2, (c,), scale=0.3), "var": 1 + jnp.abs(_rand(key + 3, (c,)))}


def _chan(v, layout):
    return v[None, :, None, None] if layout == "NCHW" else v


def _close(c0, c1, *args):
    outs = jax.jit(lambda *a: (ir.interpret(c0, *a), ir.interpret(c1, *a)))(*args)  # one compile
    for a, b in zip(*outs):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


CONV_VARIANTS = {
    "plain": dict(window_strides=(1, 1), padding=((1, 1), (1, 1))),
    "strided": dict(window_strides=(2, 2), padding=((1, 0), (2, 1))),
    "dilated": dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 2)),
    "groups": dict(window_strides=(1, 1), padding="VALID", feature_group_count=2),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("variant", sorted(CONV_VARIANTS))
@pytest.mark.parametrize("form", ["rsqrt", "div_sqrt"])
def test_fold_conv_bn_inline_forms(layout, variant, form):
    kw = dict(CONV_VARIANTS[variant])
    groups = kw.get("feature_group_count", 1)
    w = _kernel(layout, 6, 4 // groups, 3)
    bn = _bn(6)
    eps = 1e-3

    def f(x):
        z = lax.conv_general_dilated(x, w, dimension_numbers=LAYOUTS[layout], **kw)
        g, b, m, v = (_chan(bn[k], layout) for k in ("gamma", "beta", "mean", "var"))
        if form == "rsqrt":
            return g * (z - m) * lax.rsqrt(v + eps) + b
        return (z - m) / jnp.sqrt(v + eps) * g + b

    x = _x(layout)
    closed = ir.trace(f, x)
    res = P.run(P.fold_conv_bn(), closed)
    assert [r.rule for r in res.rewrites] == ["fold_conv_bn"]
    top = ir.primitive_counts(res.jaxpr, recursive=False)
    assert top["jit"] == 1 and top["sub"] == 0 and top["mul"] == 0  # one conv_bias op
    assert ir.op_view(res.jaxpr)[0].name == "conv_bias"
    _close(closed, res.jaxpr, x)
    assert not P.run(P.fold_conv_bn(), res.jaxpr).changed  # idempotent


def test_fold_named_batch_norm_matches_lecture_kernels():
    p = _block_params(8)
    x = _rand(5, (2, 8, 10, 10))
    closed = ir.trace(partial(models.resnet_block, p), x)
    res = P.run(P.fold_conv_bn(), closed)
    assert len(res.rewrites) == 2
    assert [op.name for op in ir.op_view(res.jaxpr)] == ["conv_bias", "conv_bias", "add", "relu"]
    _close(closed, res.jaxpr, x)


def test_fold_refuses_training_mode_bn_with_reason():
    w = _kernel("NCHW", 4, 4, 3)

    def train_bn(x):
        z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=LAYOUTS["NCHW"])
        mean = jnp.mean(z, axis=(0, 2, 3), keepdims=True)
        var = jnp.var(z, axis=(0, 2, 3), keepdims=True)
        return (z - mean) * lax.rsqrt(var + 1e-5)

    res = P.run(P.fold_conv_bn(), ir.trace(train_bn, _x("NCHW")))
    assert not res.changed
    assert "computed from the batch" in res.refusals[0].reason

    def named(x):
        z = models.conv(x, w, 1)
        return models.batch_norm(z, jnp.ones(4, F64), jnp.zeros(4, F64), jnp.mean(z, (0, 2, 3)),
                                 jnp.var(z, (0, 2, 3)))
    res = P.run(P.fold_conv_bn(), ir.trace(named, _x("NCHW")))
    assert not res.changed and "'mean'" in res.refusals[0].reason


def test_fold_leaves_bad_bn_alone():
    w = _kernel("NCHW", 4, 4, 3)
    bad_var = -jnp.ones((4,), F64)  # var + eps ≤ 0

    def f(x):
        return models.batch_norm(models.conv(x, w, 1), jnp.ones(4, F64), jnp.zeros(4, F64),
                                 jnp.zeros(4, F64), bad_var)
    res = P.run(P.fold_conv_bn(), ir.trace(f, _x("NCHW")))
    assert not res.changed and "not finite" in res.refusals[0].reason

    spatial = _rand(9, (1, 4, 9, 9))  # a constant that varies over space: not per-channel

    def g(x):
        return models.conv(x, w, 1) * spatial
    assert not P.run(P.fold_conv_bn(), ir.trace(g, _x("NCHW"))).changed


def _two_convs(w1, w2, kw1, kw2, relu=False, summed=True):
    def f(x):
        a = lax.conv_general_dilated(x, w1, dimension_numbers=LAYOUTS["NCHW"], **kw1)
        b = lax.conv_general_dilated(x, w2, dimension_numbers=LAYOUTS["NCHW"], **kw2)
        if relu:
            a, b = jax.nn.relu(a), jax.nn.relu(b)
        return a + b if summed else (a * 2.0, b)
    return f


BASE = dict(window_strides=(1, 1), padding=((1, 1), (1, 1)))


@pytest.mark.parametrize("change,expect", [
    (dict(window_strides=(2, 2)), "strides"), (dict(padding=((0, 0), (0, 0))), "padding"),
    (dict(rhs_dilation=(2, 2), padding=((2, 2), (2, 2))), "dilation"),
    (dict(precision=lax.Precision.HIGHEST), "precision")])
def test_merge_refusal_names_the_attribute(change, expect):
    w = _kernel("NCHW", 4, 4, 3)
    x = _x("NCHW", h=8)
    closed = ir.trace(_two_convs(w, w * 2, BASE, {**BASE, **change}, summed=False), x)
    a, b = find_sites(closed.jaxpr)
    assert expect in attribute_difference(a, b)
    assert not P.run(P.merge_parallel_convs(), closed).changed
    if expect in ("dilation", "precision"):  # same output shapes: the summed form is refused
        res = P.run(P.merge_parallel_convs(), ir.trace(
            _two_convs(w, w * 2, BASE, {**BASE, **change}), x))
        assert not res.changed and expect in res.refusals[0].reason


def test_merge_refuses_window_and_groups_and_nonlinear():
    x = _x("NCHW")
    f = _two_convs(_kernel("NCHW", 4, 4, 3), _kernel("NCHW", 4, 4, 1), BASE,
                   dict(window_strides=(1, 1), padding="VALID"))
    res = P.run(P.merge_parallel_convs(), ir.trace(f, x))
    assert "window size differs: 3×3 vs 1×1" in res.refusals[0].reason
    g = _two_convs(_kernel("NCHW", 4, 4, 3), _kernel("NCHW", 4, 2, 3), BASE,
                   {**BASE, "feature_group_count": 2})
    assert "groups" in P.run(P.merge_parallel_convs(), ir.trace(g, x)).refusals[0].reason
    w = _kernel("NCHW", 4, 4, 3)
    h = _two_convs(w, w * 0.5, BASE, BASE, relu=True)
    res = P.run(P.merge_parallel_convs(concat=False), ir.trace(h, x))
    assert not res.changed and "relu" in res.refusals[0].reason


def test_merge_summed_and_concatenated():
    x = _x("NCHW")
    w1, w2 = _kernel("NCHW", 4, 4, 3, 1), _kernel("NCHW", 4, 4, 3, 2)
    closed = ir.trace(_two_convs(w1, w2, BASE, BASE), x)
    res = P.run(P.merge_parallel_convs(), closed)
    assert ir.primitive_counts(res.jaxpr)["conv_general_dilated"] == 1
    assert ir.primitive_counts(res.jaxpr, recursive=False)["add"] == 0
    _close(closed, res.jaxpr, x)
    closed = ir.trace(_two_convs(w1, _kernel("NCHW", 6, 4, 3, 2), BASE, BASE, summed=False), x)
    res = P.run(P.merge_parallel_convs(), closed)
    assert ir.primitive_counts(res.jaxpr)["conv_general_dilated"] == 1
    _close(closed, res.jaxpr, x)
    assert not P.run(P.merge_parallel_convs(), res.jaxpr).changed


@pytest.mark.parametrize("kw", [dict(window_strides=(1, 1), padding="VALID"),
                                dict(window_strides=(2, 2), padding=((1, 0), (0, 1))),
                                dict(window_strides=(1, 1), padding="VALID", rhs_dilation=(2, 2))])
def test_enlarge_keeps_shape_and_value(kw):
    x = _x("NCHW")
    w = _kernel("NCHW", 4, 4, 1)
    closed = ir.trace(lambda x: lax.conv_general_dilated(x, w, dimension_numbers=LAYOUTS["NCHW"],
                                                         **kw), x)
    res = P.run(P.enlarge_conv_kernel(size=3), closed)
    (conv,) = [e for _, e in ir.walk(res.jaxpr) if e.primitive.name == "conv_general_dilated"]
    assert conv.invars[1].aval.shape == (4, 4, 3, 3)
    _close(closed, res.jaxpr, x)
    assert "even" in P.run(P.enlarge_conv_kernel(size=4), closed).refusals[0].reason


def test_five_steps_reach_the_lecture_graph():
    p = _block_params(8)
    x = _rand(5, (2, 8, 10, 10))
    closed = ir.trace(partial(models.resnet_block, p), x)
    pipeline = P.chain(P.fold_conv_bn(), P.merge_parallel_convs(), P.enlarge_conv_kernel(),
                       P.merge_parallel_convs(), P.dce())
    res = P.run(pipeline, closed)
    assert [op.name for op in ir.op_view(res.jaxpr)] == ["conv_bias", "relu"]
    assert [e.cost_after["kernels"] for e in res.log] == [4, 4, 4, 2, 2]
    _close(closed, res.jaxpr, x)
    g0 = jax.grad(lambda x: jnp.sum(ir.interpret(closed, x)[0]))(x)
    g1 = jax.grad(lambda x: jnp.sum(ir.interpret(res.jaxpr, x)[0]))(x)
    np.testing.assert_allclose(g0, g1, rtol=1e-10, atol=1e-12)


def test_rewrites_inside_nested_bodies():
    p = _block_params(8)
    x = _rand(5, (2, 8, 10, 10))
    f = lambda x: jax.jit(partial(models.resnet_block, p))(x) * 2.0  # noqa: E731
    closed = ir.trace(f, x)
    res = P.run(P.fold_conv_bn(), closed)
    assert len(res.rewrites) == 2 and res.rewrites[0].where.startswith("0/")
    _close(closed, res.jaxpr, x)


def test_fold_into_an_existing_conv_bias_composes():
    w, bias, bn = _kernel("NCHW", 4, 4, 3), _rand(40, (4,)), _bn(4)
    f = lambda x: models.batch_norm(models.conv_bias(x, w, bias), **bn)  # noqa: E731
    x = _x("NCHW")
    closed = ir.trace(f, x)
    res = P.run(P.fold_conv_bn(), closed)
    assert [op.name for op in ir.op_view(res.jaxpr)] == ["conv_bias"]
    _close(closed, res.jaxpr, x)


def test_grouped_convs_are_not_concatenated():
    # Found by the fuzzer: with groups, output channels belong to input groups, so stacking two
    # grouped kernels along O would wire the second conv's outputs to the wrong inputs.
    x = _x("NCHW")
    kw = {**BASE, "feature_group_count": 2}
    f = _two_convs(_kernel("NCHW", 4, 2, 3, 1), _kernel("NCHW", 4, 2, 3, 2), kw, kw, summed=False)
    closed = ir.trace(f, x)
    res = P.run(P.merge_parallel_convs(), closed)
    assert not res.changed
    summed = ir.trace(_two_convs(_kernel("NCHW", 4, 2, 3, 1), _kernel("NCHW", 4, 2, 3, 2), kw, kw), x)
    res = P.run(P.merge_parallel_convs(), summed)  # W1 + W2 keeps the group structure: fine
    assert res.changed
    _close(summed, res.jaxpr, x)


def _bn_nhwc(z, bn, eps=1e-3):
    return bn["gamma"] * (z - bn["mean"]) * lax.rsqrt(bn["var"] + eps) + bn["beta"]


@pytest.mark.parametrize("view", ["vmapped", "transpose", "broadcast"])
def test_fold_sees_through_movement_between_conv_and_bn(view):
    # equinox vmaps a per-example Conv2d: reshape (N,1,C,H,W) + squeeze before its BatchNorm
    w, bn = _kernel("NCHW", 6, 4, 3), _bn(6)

    def f(x):
        z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=LAYOUTS["NCHW"])
        if view == "vmapped":
            z = lax.squeeze(z.reshape(z.shape[0], 1, *z.shape[1:]), (1,))
        elif view == "transpose":  # to NHWC: the channel axis moves last
            return _bn_nhwc(z.transpose(0, 2, 3, 1), bn)
        else:  # (N, C, H, W) -> (2, N, C, H, W): channels stay channels
            z = lax.broadcast_in_dim(z, (2, *z.shape), (1, 2, 3, 4))
        return _bn_nhwc(z.swapaxes(-3, -1), bn).swapaxes(-3, -1)

    x = _x("NCHW")
    closed = ir.trace(f, x)
    res = P.run(P.chain(P.fold_conv_bn(), P.dce()), closed)
    assert [r.detail.split(" into")[0] for r in res.rewrites] == [
        "folded BatchNorm (per-channel scale and shift, 4 ops)"]
    assert ir.primitive_counts(res.jaxpr)["rsqrt"] == 0
    _close(closed, res.jaxpr, x)


def test_fold_refuses_what_it_cannot_fold_with_a_reason():
    w = _kernel("NCHW", 4, 4, 3)
    conv = lambda x: lax.conv_general_dilated(x, w, (1, 1), "SAME",  # noqa: E731
                                              dimension_numbers=LAYOUTS["NCHW"])
    spatial = _rand(9, (1, 4, 9, 9))
    cases = {  # the anchor (a conv feeding a per-channel affine op) matches; the rule refuses
        "varies along axis": lambda x, s: conv(x) * spatial,
        "also read by": lambda x, s: _two_uses(conv(x)),
        "computed from the function's inputs": lambda x, s: conv(x) * s[None, :, None, None],
    }
    for needle, f in cases.items():
        res = P.run(P.fold_conv_bn(), ir.trace(f, _x("NCHW"), _rand(3, (4,))))
        assert not res.changed and needle in res.refusals[0].reason, (needle, res.refusals)
    # a residual add of another tensor is not a per-channel affine op: nothing to report
    res = P.run(P.fold_conv_bn(), ir.trace(lambda x, y: conv(x) + y, _x("NCHW"), _x("NCHW")))
    assert not res.changed and not res.refusals


def _two_uses(z):
    return z * 2.0 + 1.0, z


def test_integer_scale_and_shift_fold_exactly_with_wraparound():
    w = jnp.asarray(np.arange(288).reshape(8, 4, 3, 3) % 5 - 2, jnp.int32)
    x = jnp.asarray(np.arange(648).reshape(2, 4, 9, 9) % 7, jnp.int32)
    big = np.int32(2**30 + 3)  # products wrap modulo 2³², exactly as the int32 ops do
    f = lambda x: lax.conv(x, w, (1, 1), "SAME") * big + np.int32(2**31 - 1)  # noqa: E731
    closed = ir.trace(f, x)
    res = P.run(P.chain(P.fold_conv_bn(), P.dce()), closed)
    assert res.rewrites and ir.primitive_counts(res.jaxpr, recursive=False)["mul"] == 0
    assert bool(jnp.array_equal(ir.interpret(closed, x)[0], ir.interpret(res.jaxpr, x)[0]))
    # int8 weights accumulating into int32: 100·W would wrap at 8 bits
    w8, x8 = w.astype(jnp.int8), x.astype(jnp.int8)
    g = lambda x: lax.conv_general_dilated(x, w8, (1, 1), "SAME",  # noqa: E731
                                           preferred_element_type=jnp.int32) * np.int32(100)
    res = P.run(P.fold_conv_bn(), ir.trace(g, x8))
    assert not res.changed and "wrap at the weights' width" in res.refusals[0].reason


def _downsample(pad3, h=8):
    """A ResNet downsample pair: 3×3 stride 2 (padding ``pad3``) beside a 1×1 stride-2
    projection on the same input, used apart."""
    w3, w1 = _kernel("NHWC", 6, 4, 3, 1), _kernel("NHWC", 6, 4, 1, 2)
    dn = LAYOUTS["NHWC"]

    def f(x):
        a = lax.conv_general_dilated(x, w3, (2, 2), pad3, dimension_numbers=dn)
        b = lax.conv_general_dilated(x, w1, (2, 2), ((0, 0), (0, 0)), dimension_numbers=dn)
        return jax.nn.relu(a), b * 2.0
    x = _x("NHWC", h=h)
    return ir.trace(f, x), x


def test_enlarge_puts_the_strided_1x1_at_the_tap_of_the_partners_padding():
    closed, x = _downsample(((0, 1), (0, 1)))  # flax SAME for an even input and stride 2
    assert "window size differs" in P.run(P.merge_parallel_convs(), closed).refusals[0].reason
    res = P.run(P.chain(P.enlarge_conv_kernel(), P.merge_parallel_convs(), P.dce()), closed)
    enlarged, merged = res.rewrites
    assert "tap (0, 0), padding ((0, 1), (0, 1))" in enlarged.detail
    assert "0·Inf" in enlarged.detail  # users see the finite-input precondition
    assert "concatenating" in merged.detail
    assert ir.primitive_counts(res.jaxpr)["conv_general_dilated"] == 1
    _close(closed, res.jaxpr, x)
    closed, x = _downsample(((1, 1), (1, 1)), h=9)  # odd input: SAME pads both sides
    res = P.run(P.chain(P.enlarge_conv_kernel(), P.merge_parallel_convs(), P.dce()), closed)
    assert "tap (1, 1)" in res.rewrites[0].detail and len(res.rewrites) == 2
    _close(closed, res.jaxpr, x)


def test_enlarge_refuses_where_no_tap_keeps_the_result():
    closed, _ = _downsample(((3, -1), (3, -1)), h=9)  # the 1×1 would sit outside the window
    res = P.run(P.enlarge_conv_kernel(), closed)
    assert not res.changed and "no tap keeps the result" in res.refusals[0].reason
    w3, w1 = _kernel("NCHW", 4, 4, 3, 1), _kernel("NCHW", 4, 4, 1, 2)
    dn = LAYOUTS["NCHW"]
    g = lambda x: (lax.conv_general_dilated(x, w3, (1, 1), ((1, 0), (1, 0)), dimension_numbers=dn),  # noqa: E731
                   lax.conv_general_dilated(x, w1, (1, 1), "VALID", dimension_numbers=dn))
    res = P.run(P.enlarge_conv_kernel(), ir.trace(g, _x("NCHW")))
    assert not res.changed and "8 positions instead of 9" in res.refusals[0].reason
    h = lambda x: (lax.conv_general_dilated(x, w3, (1, 1), "SAME", dimension_numbers=dn),  # noqa: E731
                   lax.conv_general_dilated(x, w1, (2, 2), "VALID", dimension_numbers=dn))
    res = P.run(P.enlarge_conv_kernel(), ir.trace(h, _x("NCHW")))
    assert not res.changed and "strides differ" in res.refusals[0].reason


def test_per_example_gates_and_norms_are_not_called_batch_statistics():
    w = _kernel("NCHW", 4, 4, 3)
    conv = lambda x: lax.conv_general_dilated(x, w, (1, 1), "SAME",  # noqa: E731
                                              dimension_numbers=LAYOUTS["NCHW"])

    def squeeze_excite(x):  # a per-example, per-channel gate computed from the conv output
        z = conv(x)
        return z * jax.nn.sigmoid(z.mean((2, 3), keepdims=True))

    def instance_norm(x):
        return jax.nn.standardize(conv(x), axis=(2, 3))
    for f in (squeeze_excite, instance_norm):
        res = P.run(P.fold_conv_bn(), ir.trace(f, _x("NCHW")))
        assert not res.changed and "per example" in res.refusals[0].reason, res.refusals
        assert "batch" not in res.refusals[0].reason
