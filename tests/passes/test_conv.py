"""The conv rewrites of §4: fold_conv_bn, merge_parallel_convs, enlarge_conv_kernel."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, models, passes as P
from mlsys_jax.passes.rewrite.linear import conv_difference as attribute_difference, convs as find_sites
from tests.passes.conv_cases import (F64, LAYOUTS, block_params as _block_params, bn as _bn,
                               chan as _chan, close as _close, image as _x, kernel as _kernel,
                               rand as _rand)

CONV_VARIANTS = {
    "plain": dict(window_strides=(1, 1), padding=((1, 1), (1, 1))),
    "strided": dict(window_strides=(2, 2), padding=((1, 0), (2, 1))),
    "dilated": dict(window_strides=(1, 1), padding="SAME", rhs_dilation=(2, 2)),
    "groups": dict(window_strides=(1, 1), padding="VALID", feature_group_count=2),
}


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
