"""Translation validation (passes/validate.py): each rewrite checked on its region before it is kept.
A broken rule's rewrites are refused with the measured reason, so the program keeps its values;
the same rule without validation changes them (what the fuzzer's mutants are hunted with)."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.fuzz import mutants
from mlsys_jax.passes.rewrite import mutate
from mlsys_jax.passes import validate as V
from tests.passes.conv_cases import LAYOUTS, bn, chan, kernel, rand


def _conv(w, **kw):
    kw = {"window_strides": (1, 1), "padding": "SAME", **kw}
    return lambda x: lax.conv_general_dilated(x, w, dimension_numbers=LAYOUTS["NCHW"], **kw)


def _conv_bn(x):
    p = bn(4)
    z = _conv(kernel("NCHW", 4, 4, 3))(x)
    return chan(p["gamma"], "NCHW") * (z - chan(p["mean"], "NCHW")) + chan(p["beta"], "NCHW")


def _parallel(x):  # a 3×3 and a 1×1 on one input, used apart: enlarge, then merge by concat
    return _conv(kernel("NCHW", 4, 4, 3, 1))(x), _conv(kernel("NCHW", 4, 4, 1, 2))(x) * 2.0


def _helper_bias_along_h(x):
    w, b = kernel("NCHW", 4, 4, 3), rand(5, (4,))

    @jax.jit
    def conv_block(x, w, b):
        return _conv(w)(x) + b[None, None, :, None]
    return conv_block(x, w, b) * chan(1.0 + rand(6, (4,)), "NCHW")


def _conv_bn_eps(x):
    p = bn(4, key=8)
    z = _conv(kernel("NCHW", 4, 4, 3))(x)
    return (z - chan(p["mean"], "NCHW")) * lax.rsqrt(chan(p["var"], "NCHW") * 1e-3 + 1e-2)


CASES = {  # mutant -> (the program it breaks, the passes the broken rule runs after)
    "conv_bn_wrong_channel_axis": (_conv_bn, ()),
    "conv_bn_no_eps": (_conv_bn_eps, ()),
    "conv_bias_ignores_the_axis": (_helper_bias_along_h, ()),
    "merge_concat_wrong_axis": (_parallel, ("enlarge_conv_kernel",)),
    "enlarge_off_centre": (_parallel, ()),
}


def _outputs(closed, x):
    return [np.asarray(o) for o in ir.interpret(closed, x)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_broken_rules_rewrites_are_refused_with_the_measured_reason(name):
    program, before = CASES[name]
    mutant = next(m for m in mutants.MUTANTS if m.name == name)
    x = rand(7, (2, 4, 4, 4))  # C == H == W: a bias along H has the channels' length
    closed = ir.trace(program, x)
    for prior in before:
        closed = P.run(P.pipeline(prior), closed).jaxpr
    want = _outputs(closed, x)
    try:  # without validation the broken rule changes the values, or cannot even emit
        unchecked = P.run(mutant.make(), closed, validate=False)
        assert unchecked.changed
        assert max(float(np.max(np.abs(a - b)))
                   for a, b in zip(want, _outputs(unchecked.jaxpr, x))) > 1e-3
    except (TypeError, ValueError) as e:
        assert "conv_general_dilated" in str(e)
    checked = P.run(mutant.make(), closed)
    refused = [r for r in checked.refusals if r.check == "translation_validation"]
    assert refused and ("differs in float64" in refused[0].reason
                        or "cannot run" in refused[0].reason)
    for a, b in zip(want, _outputs(checked.jaxpr, x)):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_validation_refuses_an_overflow_the_rule_did_not_check():
    """Without its own weights_fit_dtype check, fold_conv_bn's float16 weights × 200 overflow:
    validation sees the Inf the program would compute, and refuses."""
    from mlsys_jax.passes.rules import fold_conv_bn as rule

    w = jnp.asarray(np.random.default_rng(0).standard_normal((4, 4, 3, 3)) * 400, jnp.float16)

    def f(x):
        z = lax.conv_general_dilated(x.astype(jnp.float16), w, (1, 1), "SAME",
                                     dimension_numbers=LAYOUTS["NCHW"],
                                     preferred_element_type=jnp.float32)
        return z * jnp.full((1, 4, 1, 1), 200.0, jnp.float32)
    with jax.enable_x64(False):
        closed = ir.trace(f, jax.ShapeDtypeStruct((2, 4, 6, 6), jnp.float32))
        blind = dataclasses.replace(rule.RULE, checks=())
        res = P.run(blind.make_pass(), closed)
    assert not res.changed
    assert "Inf/NaN where the original is finite" in res.refusals[-1].reason


def test_special_values_and_draws():
    f32 = V.special_values(np.dtype(np.float32))
    assert {0.0, 1.0, -1.0} <= set(f32.tolist())
    tiny = float(np.finfo(np.float32).tiny)
    assert np.any((np.abs(f32) > 0) & (np.abs(f32) < tiny))  # subnormals
    assert np.max(np.abs(f32)) > 1e9 and np.all(np.isfinite(f32))
    i8 = V.special_values(np.dtype(np.int8))
    assert {-128, 127, 0, 1, -1} <= set(i8.tolist())
    a, b = V.draw((3, 5), np.float32, 0), V.draw((3, 5), np.float32, 0)
    assert np.array_equal(a, b) and not np.array_equal(a, V.draw((3, 5), np.float32, 1))
    assert set(np.unique(V.draw((40,), np.float32, V.DRAWS - 1))) <= set(f32.tolist())


def _fold_on_fewer_rows(rule, fn, shape, cut, want):
    """``rule``'s one rewrite of ``fn`` (traced at ``shape``) validated on the rows ``cut``
    keeps (``want``): the same verdict as on the whole batch, for it and for a wrong one."""
    from mlsys_jax.passes.rewrite.level import Level

    with jax.enable_x64(False):
        level = Level(ir.trace(fn, jax.ShapeDtypeStruct(shape, jnp.float32)))
    (m,) = [x for x in rule.match(level) if not isinstance(x, rule.Refused)]
    region = rule.RULE.region(level, m)
    assert cut(region) == [want]
    right = rule.RULE.replacement(level, m)
    assert V.validate(region, right) is None
    wrong = lambda read, widen: {k: v * 1.5 for k, v in right(read, widen).items()}  # noqa
    assert "differs in float64" in V._validate(region, wrong, cut(region))
    assert "differs in float64" in V.validate(region, wrong)


def test_large_regions_run_on_one_example_of_their_batch():
    """A conv fold on 64 examples of 8×24×24 is validated on one example."""
    from mlsys_jax.passes.rules import fold_conv_bn

    w = jnp.asarray(np.random.default_rng(0).standard_normal((8, 8, 3, 3)) / 8, jnp.float32)
    s = jnp.asarray(np.linspace(0.5, 2.0, 8), jnp.float32)
    _fold_on_fewer_rows(fold_conv_bn, lambda x: _conv(w)(x) * s[None, :, None, None],
                        (64, 8, 24, 24), V._one_row, (1, 8, 24, 24))


def test_a_dense_fold_on_a_sequence_runs_on_one_vector():
    """A Dense then a per-feature scale on (4, 64, 128) activations: every position of every
    example computes the same function, so one vector stands for all."""
    from mlsys_jax.passes.rules import fold_matmul_scale

    w = jnp.asarray(np.random.default_rng(0).standard_normal((128, 96)) / 11, jnp.float32)
    s = jnp.asarray(np.linspace(0.5, 2.0, 96), jnp.float32)
    _fold_on_fewer_rows(fold_matmul_scale, lambda x: (x @ w) * s, (4, 64, 128), V._one_vector,
                        (1, 1, 128))


def test_a_constant_that_differs_between_positions_keeps_every_position():
    """``x * table`` with a per-position table, and a replacement that reads another table, wrong
    at one position of one example only: cut to one vector (or one example) both sides would
    read the first row of their tables and agree; the table's rows differ, so the region is
    validated whole and the rewrite refused."""
    from functools import partial

    from mlsys_jax.ir.rebatch import rebind

    table = np.random.default_rng(1).standard_normal((4, 64, 128)).astype(np.float32)
    closed = jax.make_jaxpr(lambda x: x * table)(jax.ShapeDtypeStruct(table.shape, jnp.float32))
    (mul,) = closed.jaxpr.eqns
    (x,), (t,) = closed.jaxpr.invars, closed.jaxpr.constvars
    region = V.Region(eqns=(mul,), inputs=(x,), consts={t: closed.consts[0]},
                      outputs=tuple(mul.outvars), removed=frozenset({id(mul)}))
    off = table.copy()
    off[3, 40, 7] *= 1.5

    def wrong(read, widen):
        return dict(zip(mul.outvars, rebind(mul, [read(x), off],
                                            partial(V.approximate, widen=widen))))
    assert V._one_vector(region) is not None
    assert "differs in float64" in V.validate(region, wrong)
    assert V.validate(region, lambda read, widen: dict(zip(mul.outvars, rebind(
        mul, [read(x), table], partial(V.approximate, widen=widen))))) is None


def _seed0(program: int):
    from mlsys_jax.fuzz import generate_seeded, program_seed
    from mlsys_jax.fuzz.program import build

    return build(generate_seeded(program_seed(0, program)))


@pytest.mark.parametrize("program", [67, 23, 1601])
def test_constants_are_what_the_program_and_the_rewrite_make_of_them(program):
    """Campaign programs of seed 0 where a float32 rounding of constants could pass for a wrong
    value: 67, a jitted conv + bias helper on a constant input (sin of one, times 2) then
    a BatchNorm of tiny variance — the conv, removed by the rewrite, reads constants alone, and
    its float64 meaning is its float32 value or its float64 one; 23, a named ``batch_norm`` call
    whose constants (rsqrt(var + eps)) are the program's float32 values, as the rule reads them;
    1601, both at once — a conv of a constant then a named ``batch_norm``, which the rule folds
    computing the conv in float64 and reading rsqrt(var + eps) as the float32 program has it
    (its site's operand taken as an input)."""
    res = P.run(P.fold_conv_bn(), _seed0(program))
    assert res.changed
    assert not [r for r in res.refusals if r.check == "translation_validation"], res.refusals


def test_a_fold_off_by_more_than_rounding_on_constants_alone_is_refused():
    """Program 1601's fold with one channel's scale 1e-5 too large (a hundred float32 ulps):
    every float64 meaning of its constant region refuses it."""
    from mlsys_jax.passes.rewrite import fold
    real = fold.scale_weights

    def off(w, vec, site, dtype):
        vec = np.array(vec)
        vec.flat[0] *= 1 + 1e-5
        return real(w, vec, site, dtype)
    with mutate.patched(fold, "scale_weights", off):
        res = P.run(P.fold_conv_bn(), _seed0(1601))
    assert not res.changed
    (refused,) = [r for r in res.refusals if r.check == "translation_validation"]
    assert "differs in float64" in refused.reason


def test_the_draws_kept_are_the_most_recently_used(monkeypatch):
    """A process that validated other shapes first still keeps the draws it validates now (a
    full table once refused every new shape: each region's draws were drawn again each time)."""
    monkeypatch.setattr(V, "_DRAWN", type(V._DRAWN)())
    monkeypatch.setattr(V, "DRAWN_KEPT", 4)
    first = V.draw((2, 3), np.float32, 0)
    for n in range(3):
        V.draw((5, n + 1), np.float32, 0)
    assert V.draw((2, 3), np.float32, 0) is first  # used again: now the most recent
    for n in range(3, 7):
        V.draw((5, n + 1), np.float32, 1)
    assert len(V._DRAWN) == 4 and ((2, 3), np.dtype(np.float32), 0) not in V._DRAWN
    assert V.draw((5, 7), np.float32, 1) is V.draw((5, 7), np.float32, 1)
