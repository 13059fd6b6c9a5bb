"""What an equation computes in real numbers, to float64 rounding: every float widened to float64.

Translation validation (``passes/validate.py``), the value check's float64 twin
(``passes/value_check.py``) and the constant folder's subnormal test (``ir/consts.py``) ask what a
float32 (or float16, bfloat16) computation means in exact arithmetic. Widening binds an equation
on float64 values with every floating dtype in its params mapped to float64
(``convert_element_type``'s ``new_dtype``, ``dot_general``/conv's ``preferred_element_type``,
``iota``'s ``dtype``, ...); a literal is first rounded to its own dtype, since that is the value
the program computes with. Integer, boolean and PRNG-key values are left as they are. Callers
enter ``jax.enable_x64(True)``: without it JAX has no float64.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal, Tracer, bind_equation

F64 = np.dtype(np.float64)


def is_float(dtype) -> bool:
    """A real floating dtype (float16/32/64, bfloat16, ...), not an extended (PRNG key) one."""
    return not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) and jnp.issubdtype(dtype,
                                                                                   jnp.floating)


def widen_dtype(dtype):
    """float64 for a floating dtype, the dtype itself otherwise."""
    return F64 if dtype is not None and is_float(dtype) else dtype


def widened_params(params: dict) -> dict:
    """``params`` with every floating dtype (JAX keeps them as ``np.dtype``) replaced by float64."""
    return {k: widen_dtype(v) if isinstance(v, np.dtype) else v for k, v in params.items()}


def widen_value(x, dtype=None):
    """A float value (rounded to ``dtype`` first, when given) as float64; others unchanged."""
    if isinstance(x, Tracer):
        return x.astype(F64) if is_float(x.dtype) else x
    a = np.asarray(x, dtype) if dtype is not None else np.asarray(x)
    return a.astype(F64) if is_float(a.dtype) else a


def literal_value(lit: Literal, widen: bool):
    """A literal's value as the program holds it (its own dtype), widened when ``widen``."""
    return widen_value(lit.val, lit.aval.dtype) if widen else lit.val


def bind_params_widened(eqn, invals) -> list:
    """One primitive (no body) bound on ``invals`` with float64 params (``ir.evaluate`` runs
    calls and control flow body by body: ``eval_equation(..., widen=True)``)."""
    return bind_equation(eqn.replace(params=widened_params(eqn.params)), invals)
