"""optimize's value check reads each output's tolerance in the least precise dtype *that output's*
computation passes through (ir.precision), not the program's least precise anywhere: a float32
head beside a bfloat16 side output keeps float32's tolerance, so a float32 output off by a
bfloat16-sized error (1%) is wrong, while the bfloat16 output keeps bfloat16's."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import ir
from mlsys_jax.passes.value_check import check_values, tolerance_dtypes

BF16 = jnp.bfloat16
X = jnp.asarray(np.random.default_rng(0).uniform(0.5, 2.0, (64,)), jnp.float32)


@pytest.fixture(autouse=True)
def float32():
    with jax.enable_x64(False):
        yield


def _two_heads(off32: float = 0.0, off16: float = 0.0):
    """A float32 output and a bfloat16 one (computed in bfloat16, returned as float32 too, so
    the output's own dtype alone would not say it): each off by a relative error, if given."""
    def f(x):
        head = jnp.sin(x) * 3.0 * (1.0 + off32)
        side = (jnp.sin(x.astype(BF16)) * BF16(3.0) * BF16(1.0 + off16)).astype(jnp.float32)
        return head, side
    return ir.trace(f, X)


def test_each_output_gets_its_own_dataflows_dtype():
    assert tolerance_dtypes(_two_heads()) == [np.dtype(np.float32), np.dtype(BF16)]


def test_a_float32_output_off_by_a_bfloat16_sized_error_fails():
    check = check_values(_two_heads(), _two_heads(off32=1e-2), [X])
    assert check.verdict == "no"
    assert check.problems and all(p.startswith("output 0 ") for p in check.problems)
    assert check.tolerance == ("float32: 1e-06 + 0.0001·|original| per element (output 0); "
                               "bfloat16: 0.01 + 0.05·|original| per element (output 1)")


def test_the_bfloat16_output_keeps_bfloat16s_tolerance():
    check = check_values(_two_heads(), _two_heads(off16=1e-2), [X])
    assert check.verdict == "yes" and check.max_abs_diff > 1e-3  # a real difference, allowed
