"""The constants a rewrite ships are those its validation computed: what a rule computes from
constants alone (``Emit.once``: a fold's scaled kernel) is computed once per precision and cut,
and the rewrite reuses the whole one in the program's dtypes — from whole-region validation, or
from the coverage check's whole trace where the region is validated on a cut
(``passes/feature_cut.py``). The rewrite then splices in the very bits that were validated."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.passes import feature_cut
from mlsys_jax.passes.rewrite import fold

NHWC = ("NHWC", "HWIO", "NHWC")


def _conv_bn(cout: int):
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((1, 1, 32, cout)) / 10, jnp.float32)
    gamma = jnp.asarray(rng.uniform(0.5, 2.0, cout), jnp.float32)
    var = jnp.asarray(rng.uniform(0.5, 2.0, cout), jnp.float32)

    def f(x):
        y = lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=NHWC)
        return y * lax.rsqrt(var + 1e-5) * gamma
    with jax.enable_x64(False):
        return ir.trace(f, jax.ShapeDtypeStruct((2, 3, 3, 32), jnp.float32))


def _counted(monkeypatch) -> list:
    """Every computation of a fold's constants: (widened, on a cut, by validation, new kernel)."""
    calls, real = [], fold.folded

    def counted(em, site, aff):
        out = real(em, site, aff)
        calls.append((em.widen, em.cut is not None, em.concrete, out[0]))
        return out
    monkeypatch.setattr(fold, "folded", counted)
    return calls


def _kernel(closed) -> np.ndarray:
    (w,) = [c for c in closed.consts if np.ndim(c) == 4]
    return w


@pytest.mark.parametrize("cout,cut", [(64, False), (1024, True)])
def test_the_rewrite_ships_the_kernel_validation_computed(monkeypatch, cout, cut):
    monkeypatch.setattr(feature_cut, "CUT_ABOVE", 1 << 16)  # the 128 KiB kernel is cut
    closed = _conv_bn(cout)
    unchecked = _kernel(P.run(P.fold_conv_bn(), closed, validate=False).jaxpr)
    calls = _counted(monkeypatch)
    res = P.run(P.fold_conv_bn(), closed)
    assert len(res.rewrites) == 1
    assert ("translation validation on 64 of its" in res.rewrites[0].detail) == cut
    whole = [c for c in calls if not c[0] and not c[1]]
    assert len(whole) == 1 and whole[0][2]  # once, by validation (or its coverage trace)
    assert any(c[1] for c in calls) == cut
    shipped = _kernel(res.jaxpr)
    assert np.shares_memory(shipped, whole[0][3])  # the array validated, not a copy
    np.testing.assert_array_equal(shipped, unchecked)  # the bits a rewrite computes alone
