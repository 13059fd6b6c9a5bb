"""Translation validation compiled and batched (passes/validate_compiled.py): a region and its
replacement compiled once, run on every draw in one call, one executable for every region of the
same structure (constants passed in); the same verdicts as validating eagerly, and a refusal's
reason is the eager one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.fuzz import mutants
from mlsys_jax.passes import validate as V
from mlsys_jax.passes import validate_compiled as VC

NCHW = ("NCHW", "OIHW", "NCHW")


def _f32(key, shape, scale=0.3, shift=0.0):
    return jnp.asarray(shift + scale * np.random.default_rng(key).standard_normal(shape),
                       jnp.float32)


def _conv_bn(x, key):
    """A conv and an inference BatchNorm (its statistics constants): what fold_conv_bn folds."""
    w = _f32(key, (4, 4, 3, 3))
    gamma, beta, mean = (_f32(key + k, (1, 4, 1, 1), shift=float(k == 1)) for k in (1, 2, 3))
    z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NCHW)
    return gamma * (z - mean) + beta


def _blocks(x):
    """Three conv+BN blocks of one structure, each with constants of its own."""
    for key in (10, 20, 30):
        x = jnp.tanh(_conv_bn(x, key))
    return x


def _trace(fn):
    with jax.enable_x64(False):
        return ir.trace(fn, jax.ShapeDtypeStruct((2, 4, 6, 6), jnp.float32))


def _run(closed, after, make=None):
    with jax.enable_x64(False), V.compiled(after):
        return P.run(make() if make else P.pipeline("fold_constants,fold_conv_bn,dce"),
                     closed)


def _log(result):
    return ([(r.rule, r.where, r.detail) for r in result.rewrites],
            [(r.rule, r.where, r.reason) for r in result.refusals])


def test_identical_regions_share_one_executable_and_agree_with_eager_validation():
    closed = _trace(_blocks)
    eager = _run(closed, 0)
    before = dict(VC.STATS)
    compiled = _run(closed, 1)
    folds = [r for r in compiled.rewrites if r.rule == "fold_conv_bn"]
    assert len(folds) == 3
    assert _log(compiled) == _log(eager)
    assert ir.structural_hash(compiled.jaxpr) == ir.structural_hash(eager.jaxpr)
    made = VC.STATS["compiled"] - before["compiled"]
    used = VC.STATS["reused"] - before["reused"]
    assert made <= 1 and made + used == 3  # three regions, one structure: one compile at most


def test_compiled_draws_are_the_eager_ones():
    """The pair program's values on every draw are what the eager evaluation computes: in
    float64 to ~1e-15 (summation order), in float32 to its rounding of the output's scale."""
    closed = _trace(lambda x: _conv_bn(x, 40))
    seen = []
    real = VC.run

    def spy(region, replacement, shapes, given, **kw):
        got = real(region, replacement, shapes, given, **kw)
        seen.append((region, replacement, shapes, given, got))
        return got
    VC.run = spy
    try:
        _run(closed, 1)
    finally:
        VC.run = real
    assert seen
    region, replacement, shapes, given, got = seen[0]
    with jax.enable_x64(False):
        for i, (before, after, before64, after64) in enumerate(got):
            xs = [V.draw(s, v.aval.dtype, i) for s, v in zip(shapes, region.inputs)]
            want = V._evaluate(region, xs, False, given)
            scale = float(np.max(np.abs(want[0])))  # float32 sums in another order
            np.testing.assert_allclose(before[0], want[0], rtol=0, atol=1e-6 * scale)
            rep = V._replaced(region, replacement, xs, False)
            np.testing.assert_allclose(after[0], rep[0], rtol=0, atol=1e-6 * scale)
            with jax.enable_x64(True):
                want64 = V._evaluate(region, xs, True, given)
                rep64 = V._replaced(region, replacement, xs, True)
            scale = float(np.max(np.abs(want64[0])))
            np.testing.assert_allclose(before64[0], want64[0], rtol=0, atol=1e-13 * scale)
            np.testing.assert_allclose(after64[0], rep64[0], rtol=0, atol=1e-13 * scale)


def test_a_broken_fold_is_refused_compiled_with_the_eager_reason():
    mutant = next(m for m in mutants.MUTANTS if m.name == "conv_bn_wrong_channel_axis")
    closed = _trace(_blocks)
    with jax.enable_x64(False):
        closed = P.run(P.pipeline("fold_constants"), closed).jaxpr
    eager, compiled = _run(closed, 0, mutant.make), _run(closed, 1, mutant.make)
    refused = [r for r in compiled.refusals if r.check == "translation_validation"]
    assert len(refused) == 3 and "differs in float64" in refused[0].reason
    assert _log(compiled) == _log(eager)
    assert not compiled.changed


def test_by_default_a_small_region_shape_is_compiled_only_once_it_recurs(monkeypatch):
    """Compiling a pair program costs more than validating its region eagerly once (the module
    doc): a shape is compiled on its COMPILE_AFTER-th validation, a large one never."""
    monkeypatch.setattr(VC, "COMPILE_AFTER", 3)
    closed = _trace(lambda x: _conv_bn(x, 50) * 2.0)
    ran = []
    for _ in range(3):
        before = dict(VC.STATS)
        _run(closed, None)
        ran.append({k: VC.STATS[k] - before[k] for k in before})
    assert [r["deferred"] for r in ran] == [1, 1, 0]
    assert ran[2]["compiled"] + ran[2]["reused"] == 1
    monkeypatch.setattr(VC, "SMALL_ELEMENTS", 100)  # its values (288 elements) are now large
    monkeypatch.setattr(VC, "_SEEN", {})
    for _ in range(4):
        before = dict(VC.STATS)
        _run(closed, None)
        assert VC.STATS["deferred"] - before["deferred"] == 1


def test_by_default_a_region_reading_large_weights_stays_eager(monkeypatch):
    """A region with small values but large weights (a crop of a real model's conv) costs the
    reading of its weights, which eager validation does faster: it is never compiled by
    default, however often its shape recurs."""
    monkeypatch.setattr(VC, "COMPILE_AFTER", 2)
    monkeypatch.setattr(VC, "SMALL_ELEMENTS", 100)  # values ≤ 64 elements, the kernel 512
    monkeypatch.setattr(VC, "_SEEN", {})
    w, gamma = _f32(60, (64, 8, 1, 1)), _f32(61, (1, 64, 1, 1), shift=1.0)

    def f(x):
        return gamma * lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=NCHW)
    with jax.enable_x64(False):
        closed = ir.trace(f, jax.ShapeDtypeStruct((1, 8, 1, 1), jnp.float32))
    for _ in range(3):
        before = dict(VC.STATS)
        res = _run(closed, None)
        assert len(res.rewrites) == 1
        assert VC.STATS["deferred"] - before["deferred"] == 1
        assert VC.STATS["compiled"] + VC.STATS["reused"] == before["compiled"] + before["reused"]
