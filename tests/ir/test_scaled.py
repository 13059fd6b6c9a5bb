"""A fold's float64 weights kept as their factors (``ir.scaled``) and a validation's float64
contractions shared between its two sides (``ir.shared_contractions``): each computes what the
materialized product and a fresh contraction compute, and a scale that does not factor out, or
operands that differ, take the long way."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.ir import numpy_eval, shared_contractions
from mlsys_jax.ir.scaled import Scaled, output_scale
from mlsys_jax.passes import validate

LAYOUTS = [("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")]


def _conv(layout, groups=1):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 5, 4) if layout[0] == "NHWC" else (2, 4, 5, 5))
    w = rng.standard_normal((3, 3, 4 // groups, 6) if layout[1] == "HWIO"
                            else (6, 4 // groups, 3, 3)).astype(np.float32)
    (eqn,) = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=layout,
        feature_group_count=groups))(x, w.astype(np.float64)).jaxpr.eqns
    return eqn, x, w  # (the float32 weights widened where the float64 conv reads them)


def _along(w, axis, seed=1):
    shape = [1] * w.ndim
    shape[axis] = w.shape[axis]
    return np.random.default_rng(seed).uniform(0.5, 2.0, shape)


def _materialized(eqn, args):
    return validate.approximate(eqn, [np.asarray(a) for a in args], widen=True)[0]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("groups", [1, 2])
def test_a_conv_on_scaled_weights_is_the_conv_on_the_weights_scaled(layout, groups):
    with jax.enable_x64(True):
        eqn, x, w = _conv(layout, groups)
        out_axis = eqn.params["dimension_numbers"].rhs_spec[0]
        k = Scaled(w, _along(w, out_axis))
        assert output_scale(eqn, 1, k, 4) is not None
        (got,) = validate.approximate(eqn, [x, k], widen=True)
        np.testing.assert_allclose(got, _materialized(eqn, [x, k]), rtol=1e-13, atol=1e-13)
        # a scale along the kernel's input features does not factor out: the product is read
        k = Scaled(w, _along(w, eqn.params["dimension_numbers"].rhs_spec[1]))
        assert output_scale(eqn, 1, k, 4) is None
        (got,) = validate.approximate(eqn, [x, k], widen=True)
        np.testing.assert_array_equal(got, _materialized(eqn, [x, k]))


@pytest.mark.parametrize("weight_is_lhs", [False, True])
def test_a_dot_on_scaled_weights_is_the_dot_scaled(weight_is_lhs):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4, 5))
    w = rng.standard_normal((5, 7)).astype(np.float32)
    with jax.enable_x64(True):
        if weight_is_lhs:  # W (7, 5) · xᵀ: the weights' free axis is the output's first
            w = w.T.copy()
            f = lambda x, w: lax.dot_general(w, x, (((1,), (2,)), ((), ())))
            args, k_index, free = (lambda k: [k, x]), 0, 0
        else:
            f = lambda x, w: lax.dot_general(x, w, (((2,), (0,)), ((), ())))
            args, k_index, free = (lambda k: [x, k]), 1, 1
        closed = jax.make_jaxpr(f)(x, w.astype(np.float64))
        eqn = [e for e in closed.jaxpr.eqns if e.primitive.name == "dot_general"][0]
        k = Scaled(w, _along(w, free))
        assert output_scale(eqn, k_index, k, 3) is not None
        (got,) = validate.approximate(eqn, args(k), widen=True)
        np.testing.assert_allclose(got, _materialized(eqn, args(k)), rtol=1e-13, atol=1e-13)
        k = Scaled(w, _along(w, 1 - free))  # along the contracted axis: read as the product
        assert output_scale(eqn, k_index, k, 3) is None


def test_the_product_is_each_element_multiplied_once_in_float64():
    w = np.float32([[1.1, -2.3], [3.7, 0.0]])
    v = np.array([[1 / 3, np.pi]])
    assert np.array_equal(np.asarray(Scaled(w, v)), w.astype(np.float64) * v)
    assert Scaled(w, v)[1, 0] == np.float64(np.float32(3.7)) / 3


def test_a_contraction_is_shared_only_on_the_same_weights_and_an_equal_image():
    with jax.enable_x64(True):
        eqn, x, w = _conv(LAYOUTS[0])
        assert shared_contractions.lookup(eqn, [x, w]) is None  # outside a validation
        with shared_contractions.sharing():
            (first,) = validate.approximate(eqn, [x, w], widen=True)
            assert not first.flags.writeable  # no caller can change the other side's value
            view = w[...]  # the same buffer, another array object: shared
            assert shared_contractions.lookup(eqn, [x.copy(), view])[0] is first
            other = x.copy()
            other[0, 0, 0, 0] += 1
            assert shared_contractions.lookup(eqn, [other, w]) is None
            big = np.zeros((1, 1, 4, shared_contractions.BY_VALUE), np.float32)
            (e2,) = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
                x, w, (1, 1), "SAME", dimension_numbers=LAYOUTS[0]))(
                    x, big.astype(np.float64)).jaxpr.eqns
            validate.approximate(e2, [x, big], widen=True)
            # equal values in another buffer, too large to compare: computed again
            assert shared_contractions.lookup(e2, [x, big.copy()]) is None
            assert shared_contractions.lookup(e2, [x, big]) is not None


def _conv_bn():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 3, 16, 8)) / 10, jnp.float32)
    gamma = jnp.asarray(rng.uniform(0.5, 2.0, 8), jnp.float32)
    var = jnp.asarray(rng.uniform(0.5, 2.0, 8), jnp.float32)

    def f(x):
        y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=LAYOUTS[0])
        return y * lax.rsqrt(var + 1e-5) * gamma
    with jax.enable_x64(False):
        return ir.trace(f, jax.ShapeDtypeStruct((2, 6, 6, 16), jnp.float32))


def test_a_validated_fold_computes_its_float64_conv_once(monkeypatch):
    """The region's conv and the fold's conv on its scaled weights read the same kernel on the
    same draws: the region's float32 conv computes its float64 twin in the same pass over the
    kernel, which both sides' float64 convs take (the fold's float32 conv runs apart: its
    kernel differs), and the fold is validated as before."""
    convs, real = [], numpy_eval._conv

    def counted(x, w, twin=False, **params):
        convs.append((np.result_type(x, w), twin))
        return real(x, w, twin=twin, **params)
    monkeypatch.setattr(numpy_eval, "_conv", counted)
    monkeypatch.setitem(numpy_eval.OPS, numpy_eval.CONV, counted)
    res = P.run(P.fold_conv_bn(), _conv_bn())
    assert len(res.rewrites) == 1 and not res.refusals
    assert convs.count((np.float32, True)) == convs.count((np.float32, False)) > 0
    assert len(convs) == 2 * convs.count((np.float32, True))  # no float64 conv of its own


def test_a_float64_twin_is_taken_only_for_the_same_kernel_and_the_image_widened():
    with jax.enable_x64(False):
        rng = np.random.default_rng(4)
        x = rng.standard_normal((2, 5, 5, 4)).astype(np.float32)
        w = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
        (eqn,) = jax.make_jaxpr(lambda x, w: lax.conv_general_dilated(
            x, w, (1, 1), "SAME", dimension_numbers=LAYOUTS[0]))(x, w).jaxpr.eqns
    with shared_contractions.sharing():
        assert shared_contractions.with_twin(eqn, [x, w]) is None  # not twinning: as usual
        with shared_contractions.twinning():
            (low,) = shared_contractions.with_twin(eqn, [x, w])
        assert low.dtype == np.float32
        (twin,) = shared_contractions.lookup(eqn, [x.astype(np.float64), w])
        np.testing.assert_allclose(twin, _materialized(eqn, [x.astype(np.float64), w]),
                                   rtol=1e-13)
        other = w.copy()
        other[0, 0, 0, 0] += 1
        assert shared_contractions.lookup(eqn, [x.astype(np.float64), other]) is None
        assert shared_contractions.lookup(eqn, [x.astype(np.float64) + 1e-9, w]) is None
    with shared_contractions.twinning():  # outside a validation: nothing kept
        assert shared_contractions.with_twin(eqn, [x, w]) is None


def test_a_contraction_xla_computed_is_shared_as_a_numpy_view():
    """A float64 contraction too large for NumPy's table comes back from XLA as a jax.Array: it
    is kept (and handed out) as a read-only NumPy view of it."""
    with jax.enable_x64(True):
        eqn, x, w = _conv(LAYOUTS[0])
        out = jnp.ones((2, 5, 5, 6), jnp.float64)
        with shared_contractions.sharing():
            (kept,) = shared_contractions.remember(eqn, [x, w], [out])
            assert isinstance(kept, np.ndarray) and not kept.flags.writeable
            assert shared_contractions.lookup(eqn, [x, w])[0] is kept
