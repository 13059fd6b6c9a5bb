"""Translation validation with the draws stacked as rows (``passes/validate._stacked_pass``): a
region run on one row of its batch runs every draw at once, one per row, and is judged draw by
draw; a failure there is judged again draw by draw, whose verdict and reason stand."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import ir
from mlsys_jax.compat import Literal
from mlsys_jax.passes import validate as V
from mlsys_jax.passes.rewrite.level import Level
from tests.passes.test_validate_crop import _conv_scaled, _region


def _dense_scale(shape):
    """fold_matmul_scale's one rewrite of ``(x @ w) * s`` at ``shape``: its region and its right
    replacement."""
    from mlsys_jax.passes.rules import fold_matmul_scale as rule

    w = jnp.asarray(np.random.default_rng(0).standard_normal((shape[-1], 96)) / 11, jnp.float32)
    s = jnp.asarray(np.linspace(0.5, 2.0, 96), jnp.float32)
    with jax.enable_x64(False):
        level = Level(ir.trace(lambda x: (x @ w) * s, jax.ShapeDtypeStruct(shape, jnp.float32)))
    (m,) = [x for x in rule.match(level) if not isinstance(x, rule.Refused)]
    return rule.RULE.region(level, m), rule.RULE.replacement(level, m)


def _draw_by_draw_refused(*_, **__):
    raise AssertionError("judged draw by draw")


def _off_where_huge(right):
    """``right`` off only where a value is huge: on the special values' draw (the last) alone."""
    def wrong(read, widen):
        return {k: np.where(np.abs(x) > 1e6, np.asarray(x) * 1.5, x)
                for k, x in right(read, widen).items()}
    return wrong


def _reasons(region, wrong, shapes, monkeypatch) -> tuple:
    """The verdict with the draws stacked, and draw by draw alone."""
    stacked = V._validate(region, wrong, shapes)
    with monkeypatch.context() as m:
        m.setattr(V, "_stacked_pass", lambda *a, **k: False)
        return stacked, V._validate(region, wrong, shapes)


def test_a_right_fold_on_a_batch_passes_with_every_draw_at_once(monkeypatch):
    region, right = _dense_scale((4, 64, 128))
    shapes = V._one_vector(region)
    assert shapes == [(1, 1, 128)]
    with monkeypatch.context() as m:
        m.setattr(V, "_validate_eagerly", _draw_by_draw_refused)
        assert V._validate(region, right, shapes) is None
    with monkeypatch.context() as m:  # and draw by draw
        m.setattr(V, "_stacked_pass", lambda *a, **k: False)
        assert V._validate(region, right, shapes) is None


def test_each_row_is_its_draw_as_one_row_computes_it():
    region, right = _dense_scale((4, 64, 128))
    (shape,) = V._one_vector(region)
    (v,) = region.inputs
    given = V._given(region, with_removed=True)
    stacked = np.concatenate([V.draw(shape, v.aval.dtype, i) for i in range(V.DRAWS)])
    with jax.enable_x64(True):
        (rows,) = V._evaluate(region, [stacked], True, given)
        axis = V._row_axis(region.outputs[0], rows)
        for i in range(V.DRAWS):
            (alone,) = V._evaluate(region, [V.draw(shape, v.aval.dtype, i)], True, given)
            np.testing.assert_allclose(np.take(rows, [i], axis=axis), alone, rtol=1e-13,
                                       atol=0)


@pytest.mark.parametrize("wrong_on", ["every draw", "the special values"])
def test_a_wrong_fold_gets_the_reason_it_gets_draw_by_draw(monkeypatch, wrong_on):
    region, right = _dense_scale((4, 64, 128))
    shapes = V._one_vector(region)
    if wrong_on == "every draw":
        def wrong(read, widen):
            return {k: x * 1.5 for k, x in right(read, widen).items()}
    else:
        wrong = _off_where_huge(right)
    stacked, alone = _reasons(region, wrong, shapes, monkeypatch)
    assert stacked == alone and "differs in float64" in alone
    if wrong_on == "the special values":
        assert f"on input {V.DRAWS - 1}" in alone


def test_a_batch_no_longer_than_the_draws_is_judged_draw_by_draw(monkeypatch):
    # with 3 rows traced, the rows of an output could not be told from its other axes
    region, right = _dense_scale((V.DRAWS, 64, 256))
    shapes = V._one_vector(region)
    with monkeypatch.context() as m:
        m.setattr(V, "_validate_eagerly", _draw_by_draw_refused)
        with pytest.raises(AssertionError, match="draw by draw"):
            V._validate(region, right, shapes)


# ---- a batch of one: the draws grow the axis traced with one row (rebatch.growing) ----------

def test_a_fold_on_a_batch_of_one_runs_its_draws_as_three_rows(monkeypatch):
    # fold_conv_bn's rewrite of a 3×3 conv and a per-channel scale on one 64×64 image (a
    # ResNet's inference graph at batch 1)
    region, right = _region(_conv_scaled(), (1, 64, 64, 8))
    crop = V._cropped(region)
    assert crop == [(1, 3, 3, 8)]  # the crop's 3 pixels: the rows are told by the traced 1
    with monkeypatch.context() as m:
        m.setattr(V, "_validate_eagerly", _draw_by_draw_refused)
        assert V._validate(region, right, crop) is None
    stacked, alone = _reasons(region, _off_where_huge(right), crop, monkeypatch)
    assert stacked == alone and f"on input {V.DRAWS - 1}" in alone


def test_rows_grow_only_inside_growing_and_never_across_a_reduction():
    from functools import partial

    from mlsys_jax.ir import rebatch
    from mlsys_jax.ir.evaluate import eval_equation

    table = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)

    def f(x):  # an elementwise op with a constant of one row, a broadcast, a transpose
        y = jnp.tanh(x * table)
        return jnp.broadcast_to(y[:, None, :], (1, 2, 8)).transpose(1, 0, 2)
    closed = jax.make_jaxpr(f)(jax.ShapeDtypeStruct((1, 8), jnp.float32))
    rows = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)

    def run(x):
        env = dict(zip(closed.jaxpr.constvars, closed.consts))
        env[closed.jaxpr.invars[0]] = x
        for e in closed.jaxpr.eqns:
            vals = [v.val if type(v) is Literal else env[v] for v in e.invars]
            env.update(zip(e.outvars, rebatch.rebind(e, vals, partial(eval_equation))))
        return np.asarray(env[closed.jaxpr.outvars[0]])
    with pytest.raises(rebatch.Unshrinkable):  # a row more than traced: not outside growing
        run(rows)
    with rebatch.growing():
        grown = run(rows)
    assert grown.shape == (2, 3, 8)
    for i in range(3):
        np.testing.assert_array_equal(grown[:, i:i + 1], run(rows[i:i + 1]))

    mean = jax.make_jaxpr(lambda x: jnp.mean(x, axis=0))(jax.ShapeDtypeStruct((1, 8),
                                                                               jnp.float32))
    (s, *_) = mean.jaxpr.eqns
    with rebatch.growing(), pytest.raises(rebatch.Unshrinkable):
        rebatch.rebind(s, [rows], partial(eval_equation))


# ---- every draw judged at once on the stacked rows (V._every_row_passes) -------------------

def _sides(rng, rows=V.DRAWS, shape=(4, 6)):
    a32 = rng.standard_normal((rows,) + shape).astype(np.float32)
    a64 = a32.astype(np.float64) + rng.standard_normal(a32.shape) * 1e-8
    return [a32, a32.copy(), a64, a64.copy()]


def _per_draw(sides):
    runs = [[[np.take(x, [i], axis=0)] for x in sides] for i in range(V.DRAWS)]
    return V._every_draw_passes(runs, floats=True, narrow=True, low=None)


def _stacked(sides):
    return V._every_row_passes([[x] for x in sides], [0], floats=True, narrow=True)


@pytest.mark.parametrize("case", ["equal", "one draw off", "off by rounding", "nan alike",
                                  "nan elsewhere", "inf sign", "new inf in float32",
                                  "a draw of zeros"])
def test_every_row_passes_where_every_draw_passes(case):
    """All draws at once: the verdict draw by draw's (each draw's rms its own row's)."""
    sides = _sides(np.random.default_rng(5))
    a32, b32, a64, b64 = sides
    if case == "one draw off":
        b64[1, 2, 3] *= 1.001
    elif case == "off by rounding":
        b64 += np.abs(a64) * 1e-13
    elif case == "nan alike":
        a64[0, 0, 0] = b64[0, 0, 0] = np.nan
        a64[2, 1, 1] = b64[2, 1, 1] = -np.inf
    elif case == "nan elsewhere":
        a64[0, 0, 0], b64[0, 0, 1] = np.nan, np.nan
    elif case == "inf sign":
        a64[1, 0, 0], b64[1, 0, 0] = np.inf, -np.inf
    elif case == "new inf in float32":
        b32[2, 3, 5] = np.inf
    elif case == "a draw of zeros":  # its rms is its own: a tiny error there is no rounding
        a32[2], b32[2], a64[2], b64[2] = 0.0, 0.0, 0.0, 0.0
        b64[2, 0, 0] = 1e-30
    want = case in ("equal", "off by rounding", "nan alike")
    assert _per_draw(sides) is want
    assert _stacked(sides) is want


def test_a_right_fold_passes_every_draw_at_once_without_judging_draw_by_draw(monkeypatch):
    region, right = _region(_conv_scaled(), (1, 64, 64, 8))
    with monkeypatch.context() as m:
        m.setattr(V, "_validate_eagerly", _draw_by_draw_refused)
        m.setattr(V, "_every_draw_passes", _draw_by_draw_refused)
        assert V._validate(region, right, V._cropped(region)) is None


def test_a_float64_nan_where_the_original_has_one_agrees():
    """The same Inf/NaN in the same places on both sides is agreement (it was refused: NaN is
    never equal to itself), NaN elsewhere or an Inf of the other sign is not."""
    a = np.array([1.0, np.nan, np.inf, -2.0])
    assert V._close64(0, 0, a, a.copy(), a.astype(np.float32)) is None
    for other in ([1.0, 2.0, np.inf, np.nan], [1.0, np.nan, -np.inf, -2.0]):
        assert "Inf/NaN" in V._close64(0, 0, a, np.array(other), a.astype(np.float32))
