"""The conv rewrites on the code frameworks generate, and their refusals: BatchNorm folds through
reshape/squeeze/transpose/broadcast; what cannot fold says why (a constant that is not per-channel,
a traced parameter, a per-example gate, integer division or narrow integer weights); the strided
1×1 of a ResNet downsample is enlarged at the tap its partner's padding needs, or refused."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from tests.passes.conv_cases import (LAYOUTS, bn as _bn, close as _close, image as _x, kernel as _kernel,
                              rand as _rand)


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


@pytest.mark.slow
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
