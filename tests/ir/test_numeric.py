"""What validation evaluates with: NumPy's conv and dot_general (ir/numpy_eval.py) against lax,
equations bound again on one example of their batch or some of their features (ir/rebatch.py),
and the float64 meaning of an equation (ir/widen.py), large weights widened a block at a time."""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Literal

from mlsys_jax import ir
from mlsys_jax.ir import numpy_eval
from mlsys_jax.ir.evaluate import eval_equation
from mlsys_jax.ir.rebatch import Unshrinkable, rebind
from mlsys_jax.ir import widen
from mlsys_jax.ir.widen import widen_value, widened_params

LAYOUTS = [("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC"), ("NCHW", "HWIO", "NHWC")]
CONFIGS = [c for c in itertools.product(LAYOUTS, (1, 3), (1, 2), ("SAME", ((1, 0), (2, -1))),
                                        (1, 2), (1, 2), (1, 2))
           if not (c[3] == "SAME" and c[4] > 1)]  # lax has no SAME for input dilation
SAMPLE = [(LAYOUTS[0], 3, 1, "SAME", 1, 2, 2), (LAYOUTS[1], 3, 2, ((1, 0), (2, -1)), 2, 1, 1),
          (LAYOUTS[2], 1, 2, "SAME", 1, 1, 2), (LAYOUTS[1], 3, 1, ((1, 0), (2, -1)), 2, 2, 2)]


def _conv_agrees(layout, k, stride, pad, lhs_dil, rhs_dil, groups):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 7, 6) if layout[0] == "NCHW" else (2, 7, 6, 4))
    w = rng.standard_normal((6, 4 // groups, k, k) if layout[1] == "OIHW" else (k, k, 4 // groups, 6))

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (stride, stride), pad, lhs_dilation=(lhs_dil,) * 2,
                                        rhs_dilation=(rhs_dil,) * 2, dimension_numbers=layout,
                                        feature_group_count=groups)
    (eqn,) = jax.make_jaxpr(conv)(x, w).jaxpr.eqns
    got = numpy_eval.evaluate(eqn, [x, w], np.float64)[0]
    np.testing.assert_allclose(got, np.asarray(conv(x, w)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("windows", [numpy_eval.WINDOWS_ELEMENTS, 0])
def test_numpy_conv_is_laxs_on_every_kind_of_param(windows, monkeypatch):
    # a sample with each layout, padding, dilation, stride and group count (each config is a
    # compile of lax's kernel; all 144 agree too, to 1e-12), as one product of the windows
    # and tap by tap
    monkeypatch.setattr(numpy_eval, "WINDOWS_ELEMENTS", windows)
    calls = []
    real = numpy_eval._by_windows
    monkeypatch.setattr(numpy_eval, "_by_windows", lambda *a, **k: calls.append(1) or real(*a, **k))
    for config in SAMPLE:
        _conv_agrees(*config)
    assert len(calls) == (len(SAMPLE) if windows else 0)


def _conv_eqn(x, w, groups=1):
    (eqn,) = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=groups))(x, w).jaxpr.eqns
    return eqn


def test_a_float32_conv_is_a_blas_product_of_its_windows_and_flushes_as_xlas_conv(monkeypatch):
    """XLA:CPU flushes subnormals; BLAS computes them (slowly, on the special values' draw). An
    ungrouped float32 conv is NumPy's float32 product of its windows, its subnormal inputs and
    results zero: it agrees with XLA's conv kernel to float32's rounding, and where that kernel
    flushes each subnormal partial sum to zero, it keeps at most their sum: under the number of
    terms times float32's smallest normal."""
    calls, real = [], numpy_eval._f32_product
    monkeypatch.setattr(numpy_eval, "_f32_product", lambda a, b: calls.append(1) or real(a, b))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 3, 3, 256)).astype(np.float32)
    x[2] = np.finfo(np.float32).tiny  # every product tiny × w (|w| < 1) is subnormal
    x[1, 0, 0, :8] = np.float32(1e-45)  # subnormal inputs: zero, as XLA reads them
    w = rng.uniform(-0.9, 0.9, (3, 3, 256, 256)).astype(np.float32)
    (got,) = numpy_eval.evaluate(_conv_eqn(x, w), [x, w], np.float32)
    want = np.asarray(lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                               dimension_numbers=("NHWC", "HWIO", "NHWC")))
    assert calls == [1] and got.dtype == np.float32
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-4, atol=1e-4)
    tiny = np.finfo(np.float32).tiny
    assert not want[2].any() and np.abs(got[2]).max() < 3 * 3 * 256 * tiny


def test_a_grouped_float32_conv_is_not_a_product_of_its_windows(monkeypatch):
    """A grouped float32 conv runs tap by tap where it is small, else XLA's conv kernel."""
    monkeypatch.setattr(numpy_eval, "_by_windows", lambda *a: pytest.fail("windows in float32"))
    x, w = np.ones((3, 3, 3, 8), np.float32), np.ones((3, 3, 4, 8), np.float32)
    (got,) = numpy_eval.evaluate(_conv_eqn(x, w, groups=2), [x, w], np.float32)
    np.testing.assert_allclose(got, lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=2), rtol=1e-6)
    x, w = np.ones((3, 3, 3, 256), np.float32), np.ones((3, 3, 128, 256), np.float32)
    assert numpy_eval.evaluate(_conv_eqn(x, w, groups=2), [x, w], np.float32) is None


def test_a_float64_product_widens_a_narrow_kernel_a_block_at_a_time(monkeypatch):
    """Its float64 product with a float32 matrix widened a block at a time is the product with
    the whole matrix widened (to float64's rounding: the sums are split by block), and its float32
    twin computed in the same pass is the float32 product."""
    monkeypatch.setattr(numpy_eval, "WIDE_ROWS_BYTES", 8 * 16 * 7)  # 7 rows a block: 10 blocks
    rng = np.random.default_rng(2)
    a32 = rng.standard_normal((5, 64)).astype(np.float32)
    w = rng.standard_normal((64, 16)).astype(np.float32)
    a = a32.astype(np.float64)
    want = a @ w.astype(np.float64)
    np.testing.assert_allclose(numpy_eval._wide_product(a, w), want, rtol=1e-13, atol=1e-13)
    low, wide = numpy_eval._wide_product(a, w, narrow=a32)
    assert low.dtype == np.float32 and np.array_equal(wide, numpy_eval._wide_product(a, w))
    np.testing.assert_allclose(low, a32 @ w, rtol=1e-5, atol=1e-5)


def test_a_float32_conv_and_its_float64_twin_are_those_computed_apart(monkeypatch):
    monkeypatch.setattr(numpy_eval, "WIDE_ROWS_BYTES", 8 * 32 * 5)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 5, 12)).astype(np.float32)
    w = rng.standard_normal((3, 3, 12, 32)).astype(np.float32)
    eqn = _conv_eqn(x, w)
    (low,), (twin,) = numpy_eval.conv_twins(eqn, [x, w])
    np.testing.assert_allclose(low, numpy_eval.evaluate(eqn, [x, w], np.float32)[0],
                               rtol=1e-5, atol=1e-5)
    assert low.dtype == np.float32
    assert np.array_equal(twin, numpy_eval.conv_widened(eqn, [x.astype(np.float64), w])[0])
    assert numpy_eval.conv_twins(_conv_eqn(x, w[:, :, :6], groups=2), [x, w[:, :, :6]]) is None


def test_numpy_dot_general_and_the_dtype_it_computes_in():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 2))
    dims = (((2,), (1,)), ((0,), (0,)))
    (eqn,) = jax.make_jaxpr(lambda a, b: lax.dot_general(a, b, dims))(a, b).jaxpr.eqns
    np.testing.assert_allclose(numpy_eval.evaluate(eqn, [a, b], np.float64)[0],
                               np.asarray(lax.dot_general(a, b, dims)), rtol=1e-12)
    assert numpy_eval.compute_dtype(jnp.float16) == np.float32  # as XLA:CPU computes 16-bit
    assert numpy_eval.compute_dtype(np.int8) == np.int64        # wrapped back to its width
    big = np.full((2, 2), 2**30, np.int32)
    (mul,) = jax.make_jaxpr(lambda x: x * x)(big).jaxpr.eqns
    assert np.array_equal(numpy_eval.evaluate(mul, [big, big], np.int32)[0], big * big)


def test_rebind_runs_one_example_where_the_rows_stay_apart():
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    bias = np.tile(np.arange(3 * 4, dtype=np.float32).reshape(3, 4) * 0.5, (2, 1, 1))  # cut too

    def f(x):
        y = jnp.broadcast_to(x[:, None], (2, 5, 3, 4)).reshape(2, 5, 12)
        return jnp.sum(y, axis=1), x + bias
    closed = jax.make_jaxpr(f)(x)
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env[closed.jaxpr.invars[0]] = x[:1]
    for eqn in closed.jaxpr.eqns:
        vals = [v.val if type(v) is Literal else env[v] for v in eqn.invars]
        env.update(zip(eqn.outvars, rebind(eqn, vals, lambda e, a: eval_equation(e, a))))
    full = f(x)
    for o, want in zip(closed.jaxpr.outvars, full):
        np.testing.assert_array_equal(np.asarray(env[o]), np.asarray(want)[:1])


def test_rebind_refuses_a_constant_that_differs_between_the_rows():
    """One row stands for the others only where they compute the same function: a full-size
    constant that differs from row to row (a per-example or per-position table) is not cut."""
    x = np.ones((2, 3), np.float32)
    table = np.array([[0.0, 1.0, 2.0], [0.0, 1.0, 2.5]], np.float32)  # rows differ at one element
    (add,) = jax.make_jaxpr(lambda x: x + table)(x).jaxpr.eqns
    with pytest.raises(Unshrinkable, match="differs along axis 0"):
        rebind(add, [x[:1], table], lambda e, a: eval_equation(e, a))
    same = np.tile(table[:1], (2, 1))
    (out,) = rebind(add, [x[:1], same], lambda e, a: eval_equation(e, a))
    np.testing.assert_array_equal(np.asarray(out), x[:1] + same[:1])


def test_rebind_refuses_what_mixes_the_rows():
    x = np.ones((2, 3), np.float32)
    (eqn,) = jax.make_jaxpr(lambda x: x.reshape(6))(x).jaxpr.eqns
    with pytest.raises(Unshrinkable):
        rebind(eqn, [x[:1]], lambda e, a: eval_equation(e, a))
    (dot,) = jax.make_jaxpr(lambda x: x.T @ x)(x).jaxpr.eqns[-1:]
    with pytest.raises(Unshrinkable):
        rebind(dot, [x[:1].T, x[:1]], lambda e, a: eval_equation(e, a))


def test_widening_maps_every_float_dtype_of_an_equation():
    x = jnp.ones((3,), jnp.float16)
    closed = ir.trace(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32)
                      .astype(jnp.bfloat16), x)
    dot, convert = closed.jaxpr.eqns
    assert widened_params(dot.params)["preferred_element_type"] == np.float64
    assert widened_params(convert.params)["new_dtype"] == np.float64
    with jax.enable_x64(True):
        out = eval_equation(convert, [np.float64(1.0 + 2**-20)], widen=True)[0]
    assert np.asarray(out).dtype == np.float64 and float(out) == 1.0 + 2**-20  # not rounded


def test_rebind_cuts_a_full_size_operand_at_the_features_a_cut_keeps():
    keep = np.array([0, 3, 4])
    bias = np.arange(10.0).reshape(2, 5)  # full size along the features: sliced at keep
    closed = jax.make_jaxpr(lambda y: y * 2.0 + bias)(np.zeros((2, 5)))
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    y = np.arange(10.0).reshape(2, 5) - 3.0
    env[closed.jaxpr.invars[0]] = y[:, keep]
    for eqn in closed.jaxpr.eqns:
        vals = [v.val if type(v) is Literal else env[v] for v in eqn.invars]
        env.update(zip(eqn.outvars, rebind(eqn, vals, lambda e, a: eval_equation(e, a),
                                           {(5, 3): keep})))
    np.testing.assert_array_equal(env[closed.jaxpr.outvars[0]], (y * 2.0 + bias)[:, keep])


def test_rebind_refuses_a_grouped_conv_on_a_cut_of_its_kernel():
    x, w = np.ones((1, 3, 3, 4), np.float32), np.ones((1, 1, 2, 8), np.float32)
    (eqn,) = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
        feature_group_count=2))(x, w).jaxpr.eqns
    keep = np.array([0, 1, 6, 7])
    with pytest.raises(Unshrinkable):
        rebind(eqn, [x, w[..., keep]], lambda e, a: eval_equation(e, a), {(8, 4): keep})
    assert widen.bind_widened_blocks(eqn, [x, w]) is None  # nor widened a block at a time


@pytest.mark.slow  # a float64 kernel compiled per block shape: ~1 s
def test_large_weights_are_widened_a_block_of_output_features_at_a_time(monkeypatch):
    """What widening the whole contraction gives, by blocks: concrete (a bind per block, the
    last one shorter) and traced (a fori_loop, the last block overlapping the one before)."""
    monkeypatch.setattr(widen, "WIDE_BLOCK_BYTES", 1 << 10)
    rng = np.random.default_rng(2)
    conv = lambda x, w: lax.conv_general_dilated(  # noqa: E731
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    dot = lambda a, b: lax.dot_general(a, b, (((1,), (0,)), ((), ())))  # noqa: E731
    cases = ((conv, (rng.standard_normal((2, 5, 5, 3)), rng.standard_normal((3, 3, 3, 70)))),
             (dot, (rng.standard_normal((4, 9)), rng.standard_normal((9, 6, 23)))))
    for f, args in cases:
        args = [a.astype(np.float32) for a in args]
        (eqn,) = jax.make_jaxpr(f)(*args).jaxpr.eqns
        with jax.enable_x64(True):
            whole = np.asarray(eval_equation(eqn, [widen_value(a) for a in args], widen=True)[0])
            blocks = widen.bind_widened_blocks(eqn, args)[0]
            traced = np.asarray(jax.jit(lambda *a: widen.bind_widened_blocks(eqn, list(a))[0])(  # noqa: B023 (called in this iteration)
                *args))
        for got in (blocks, traced):
            assert got.dtype == np.float64 and got.shape == whole.shape
            np.testing.assert_allclose(got, whole, rtol=1e-12, atol=1e-12)
