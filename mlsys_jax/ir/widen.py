"""What an equation computes in real numbers, to float64 rounding: every float widened to float64.

Translation validation (``passes/validate.py``), the value check's float64 twin
(``passes/value_check.py``) and the constant folder's subnormal test (``ir/consts.py``) ask what a
float32 (or float16, bfloat16) computation means in exact arithmetic. Widening binds an equation
on float64 values with every floating dtype in its params mapped to float64
(``convert_element_type``'s ``new_dtype``, ``dot_general``/conv's ``preferred_element_type``,
``iota``'s ``dtype``, ...); a literal is first rounded to its own dtype, since that is the value
the program computes with. Integer, boolean and PRNG-key values are left as they are. Callers
enter ``jax.enable_x64(True)``: without it JAX has no float64.

A contraction whose float32 (or 16-bit) weights are large is widened a block of its output
features at a time (:func:`bind_widened_blocks`): a 512 MiB kernel widened whole is a 1 GiB
copy, the largest allocation of an ``optimize`` that folds it. Each output feature of a conv or
``dot_general`` reads its own slice of the weights alone, so the blocks compute what the whole
computes (to float64's rounding of the sums' order).
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import Literal, Tracer, bind_equation

F64 = np.dtype(np.float64)


def is_float(dtype) -> bool:
    """A real floating dtype (float16/32/64, bfloat16, ...), not an extended (PRNG key) one."""
    try:
        return _IS_FLOAT[dtype]
    except (KeyError, TypeError):  # (TypeError: an unhashable dtype-like, asked each time)
        got = not jax.dtypes.issubdtype(dtype, jax.dtypes.extended) and jnp.issubdtype(
            dtype, jnp.floating)
    try:
        _IS_FLOAT[dtype] = got
    except TypeError:
        pass
    return got


_IS_FLOAT: dict = {}  # dtype -> is_float: validation asks per value, JAX's answer costs µs


def widen_dtype(dtype):
    """float64 for a floating dtype, the dtype itself otherwise."""
    return F64 if dtype is not None and is_float(dtype) else dtype


def widened_params(params: dict) -> dict:
    """``params`` with every floating dtype (JAX keeps them as ``np.dtype``) replaced by float64."""
    return {k: widen_dtype(v) if isinstance(v, np.dtype) else v for k, v in params.items()}


def widen_value(x, dtype=None):
    """A float value (rounded to ``dtype`` first, when given) as float64; others unchanged."""
    if isinstance(x, Tracer):
        return x.astype(F64) if is_float(x.dtype) and x.dtype != F64 else x
    if dtype is None and hasattr(x, "dtype") and (not is_float(x.dtype) or x.dtype == F64):
        return x  # integers, booleans, PRNG keys, float64: as they are (a jax Array stays one)
    a = np.asarray(x, dtype) if dtype is not None else np.asarray(x)
    return a.astype(F64) if is_float(a.dtype) and a.dtype != F64 else a


def literal_value(lit: Literal, widen: bool):
    """A literal's value as the program holds it (its own dtype), widened when ``widen``."""
    return widen_value(lit.val, lit.aval.dtype) if widen else lit.val


def bind_params_widened(eqn, invals) -> list:
    """One primitive (no body) bound on ``invals`` with float64 params (``ir.evaluate`` runs
    calls and control flow body by body: ``eval_equation(..., widen=True)``)."""
    return bind_equation(eqn.replace(params=widened_params(eqn.params)), invals)


WIDE_BLOCK_BYTES = 1 << 26  # a contraction's widened weights, at most this many bytes at a time


def _blocking(eqn, vals):
    """(operand, its axis, the output's axis) to widen ``eqn`` along a block at a time: the
    largest narrow float operand whose float64 copy exceeds ``WIDE_BLOCK_BYTES``, along its
    longest output-feature axis (a conv's kernel output features, ungrouped; a dot_general's
    free axes); None if there is none."""
    name = eqn.primitive.name
    if name == "conv_general_dilated":
        p = eqn.params
        if p["feature_group_count"] != 1 or p["batch_group_count"] != 1:
            return None
        dn = p["dimension_numbers"]
        candidates = [(1, dn.rhs_spec[0], dn.out_spec[1])]
    elif name == "dot_general":
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        free = [[a for a in range(np.ndim(x)) if a not in c and a not in b]
                for x, c, b in zip(vals, (lc, rc), (lb, rb))]
        candidates = [(0, a, len(lb) + i) for i, a in enumerate(free[0])]
        candidates += [(1, a, len(lb) + len(free[0]) + i) for i, a in enumerate(free[1])]
    else:
        return None
    best = None
    for k, axis, out_axis in candidates:
        x = vals[k]
        dt = np.dtype(x.dtype)
        wide = math.prod(np.shape(x)) * F64.itemsize
        if not is_float(dt) or dt == F64 or wide <= WIDE_BLOCK_BYTES or np.shape(x)[axis] < 2:
            continue
        key = (wide, np.shape(x)[axis])
        if best is None or key > best[0]:
            best = (key, k, axis, out_axis)
    return None if best is None else best[1:]


def bind_widened_blocks(eqn, vals) -> list | None:
    """``eqn`` (a conv or dot_general) in float64 on ``vals`` (as the program holds them, not
    yet widened), its large narrow weights widened one block of output features at a time; None
    where no operand is that large (the caller widens and binds as usual). Concrete values run a
    block per bind; traced ones (a jitted float64 twin) a ``fori_loop``, which holds one block's
    float64 copy at a time."""
    plan = _blocking(eqn, vals)
    if plan is None:
        return None
    k, axis, out_axis = plan
    w = vals[k]
    n = np.shape(w)[axis]
    blocks = -(-math.prod(np.shape(w)) * F64.itemsize // WIDE_BLOCK_BYTES)
    step = -(-n // blocks)
    wide = [None if i == k else widen_value(x) for i, x in enumerate(vals)]

    def part(block):
        args = list(wide)
        args[k] = widen_value(block)
        return bind_params_widened(eqn, args)[0]
    if not any(isinstance(x, Tracer) for x in vals):
        w = np.asarray(w)
        cut = lambda s: tuple(slice(s, s + step) if a == axis else slice(None)  # noqa: E731
                              for a in range(w.ndim))
        return [np.concatenate([np.asarray(part(w[cut(s)])) for s in range(0, n, step)],
                               axis=out_axis)]
    shape = list(np.shape(w))
    shape[axis] = step
    probe = jax.eval_shape(part, jax.ShapeDtypeStruct(tuple(shape), w.dtype))
    full = list(probe.shape)
    full[out_axis] = n

    def body(i, acc):
        start = jnp.minimum(i * step, n - step)  # the last block ends at n (it may overlap)
        y = part(lax.dynamic_slice_in_dim(w, start, step, axis))
        return lax.dynamic_update_slice_in_dim(acc, y, start, out_axis)
    return [lax.fori_loop(0, blocks, body, jnp.zeros(full, probe.dtype))]
