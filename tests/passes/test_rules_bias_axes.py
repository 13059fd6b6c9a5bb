"""A bias (or scale) broadcast along the wrong axis, where that axis has the features' length:
every rule refuses it with a reason or rewrites it correctly (judged per element on several
inputs): a jitted ``conv(x, w) + b[None, None, :, None]`` with H == C has a bias of the channels'
length that is not per-channel, and a check of its shape alone would fold it along the channels."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.passes import registry
from mlsys_jax.passes.value_check import check_values
from tests.passes.conv_cases import rand

C = 4  # channels, height and width alike: a bias of C elements fits every axis
DIMS = {"NCHW": ("NCHW", "OIHW", "NCHW"), "NHWC": ("NHWC", "HWIO", "NHWC")}


def _helper(layout, axis):
    w = rand(1, (C, C, 3, 3) if layout == "NCHW" else (3, 3, C, C), scale=0.3)
    b, s = rand(2, (C,), scale=10.0), 1.0 + rand(3, (C,), scale=0.3)
    ch = 1 if layout == "NCHW" else 3
    index = lambda v, a: v[tuple(slice(None) if d == a else None for d in range(4))]  # noqa

    @jax.jit
    def conv_block(x, w, b):
        z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DIMS[layout])
        return z + index(b, axis)

    def f(x):  # then a per-channel scale and shift: what fold_conv_bn folds
        y = conv_block(x, w, b) * index(s, ch) + index(b, ch)
        return y, conv_block(x, w * 0.5, b)  # two helpers on one input: merge's anchor
    return f


def _dense(x):
    w, b, s = rand(4, (8, C), scale=0.3), rand(5, (C,), scale=10.0), 1.0 + rand(6, (C,))
    return (x @ w + b[:, None]) * s + b  # rows == features: the bias runs along the rows


CASES = {"NCHW H == C": ("NCHW", 2), "NCHW W == C": ("NCHW", 3), "NHWC H == C": ("NHWC", 1),
         "NCHW along channels": ("NCHW", 1)}
RULES = [n for n, e in registry.PASSES.items() if e.rule is not None]


def _programs():
    out = {name: (ir.trace(_helper(*spec), jax.ShapeDtypeStruct(
        (2, C, C, C), jnp.float64)), (2, C, C, C)) for name, spec in CASES.items()}
    out["dense rows == features"] = (ir.trace(_dense, jax.ShapeDtypeStruct((C, 8), jnp.float64)),
                                     (C, 8))
    return out


@pytest.fixture(scope="module")
def programs():
    return _programs()


@pytest.mark.parametrize("opened", [False, True], ids=["as written", "inlined"])
@pytest.mark.parametrize("rule", RULES)
def test_every_rule_refuses_with_a_reason_or_rewrites_correctly(programs, rule, opened):
    for name, (closed, shape) in programs.items():
        p = P.chain(P.inline(), registry.make(rule)) if opened else registry.make(rule)
        res = P.run(p, closed)
        fired = [r for r in res.rewrites if r.rule == rule]
        if fired:  # rewritten: the values must be the program's, element by element
            check = check_values(closed, res.jaxpr, [rand(9, shape)])
            assert check.verdict == "yes", (name, fired, check.problems)


@pytest.mark.parametrize("name", [n for n in CASES if "channels" not in n])
def test_fold_conv_bn_names_the_axis_it_cannot_fold(programs, name):
    closed, _ = programs[name]
    axis = CASES[name][1]
    res = P.run(P.fold_conv_bn(), closed)  # inside the helper: the bias is its argument
    assert not [r for r in res.rewrites if "into conv" in r.detail and "/" not in r.where]
    assert any(f"broadcast along axis {axis}" in r.reason for r in res.refusals), res.refusals
    opened = P.run(P.chain(P.inline(), P.fold_conv_bn()), closed)
    assert not [r for r in opened.rewrites if r.rule == "fold_conv_bn"]
    assert any(f"varies along axis {axis}" in r.reason for r in opened.refusals)


def test_the_bias_along_the_channels_still_folds(programs):
    """A helper whose bias runs along the channels is a conv_bias op: the scale and shift after
    it fold into it (and inline leaves it closed, so the fold does not have to make it again)."""
    closed, shape = programs["NCHW along channels"]
    for p in (P.fold_conv_bn(), P.chain(P.inline(), P.fold_conv_bn())):
        res = P.run(p, closed)
        (fold,) = [r for r in res.rewrites if r.rule == "fold_conv_bn"]
        assert "per-channel scale and shift" in fold.detail
        assert check_values(closed, res.jaxpr, [rand(9, shape)]).verdict == "yes"
