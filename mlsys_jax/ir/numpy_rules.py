"""Primitives NumPy computes bit for bit as XLA does, so the op-by-op evaluator can skip compiling
them (docs/verification.md §3: the fuzzer's reference evaluation).

Op-by-op evaluation compiles one XLA kernel per new (primitive, shape, params); in the fuzzer's CI
tier that compiling was ~78% of the CPU time, and random programs rarely repeat a shape. A rule
here replaces the kernel only where the result is the same bits by construction:

- data moves (reshape, transpose, broadcast, slice, pad, concatenate, rev, select): no arithmetic;
- IEEE-754 operations that are correctly rounded (+, −, ×, ÷, √, comparisons): one right answer,
  computed on XLA:CPU's terms — subnormal inputs read as zero and subnormal results flushed to
  zero (XLA:CPU runs with DAZ/FTZ, measured), 16-bit floats computed in float32 and rounded back;
- sign and bit operations (negation, |x|, and/or/xor/not) and what XLA computes by a formula
  we restate (max/min with -0 below +0, integer_pow's multiplication order, shifts past the bit
  width, and a / broadcast(b) as a · (1/b), XLA's own simplification — found by the fuzzer).

Which NaN comes out where two different NaNs meet, or where max/min sees a NaN, depends on the
instruction LLVM emits for this CPU, so those equations are left to XLA. ``agrees_with_xla``
checks these assumptions once per process and turns every rule off on a backend that differs.
Everything else (transcendentals, reductions, dots, convolutions, integer division) keeps JAX's
own kernel. ``tests/ir/test_numpy_rules.py`` checks every rule against ``bind`` on special values for
every dtype it accepts; a rule that would see another dtype declines (returns None).
"""
from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from ml_dtypes import bfloat16

from mlsys_jax.compat import bind_equation
from mlsys_jax.ir.primitives import ELEMENTWISE

F32_64 = (np.dtype(np.float32), np.dtype(np.float64))
FLOATS = F32_64 + (np.dtype(np.float16), np.dtype(bfloat16))
INTS = tuple(np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64,
                                    np.uint8, np.uint16, np.uint32, np.uint64))
BOOL = (np.dtype(np.bool_),)
ANY = FLOATS + INTS + BOOL


def _wide(x):
    """A float as XLA:CPU's arithmetic sees it: 16-bit floats widened to float32, and subnormal
    inputs read as zero of the same sign (XLA:CPU runs with denormals-are-zero)."""
    x = x.astype(np.float64 if x.dtype == np.float64 else np.float32, copy=False)
    tiny = np.finfo(x.dtype).tiny
    if not _any_subnormal(x, tiny):  # nothing to flush: no copy of a large constant
        return x
    return np.where(np.abs(x) < tiny, np.copysign(0, x).astype(x.dtype), x)


def _any_subnormal(x, tiny, chunk: int = 1 << 22) -> bool:
    """Whether ``x`` holds a subnormal, looked at ``chunk`` elements at a time (no temporary
    the size of a large constant)."""
    flat = x.reshape(-1)
    for lo in range(0, flat.size, chunk):
        a = np.abs(flat[lo:lo + chunk])
        if np.any((a < tiny) & (a > 0)):
            return True
    return False


def _flush(r):
    """Flush-to-zero: a subnormal result becomes zero of its sign (float results only)."""
    return _wide(r) if r.dtype.kind == "f" else r


def _on_xla_terms(fn, xs, dtype):
    """``fn`` of floats on XLA:CPU's terms: widened, denormals read as and flushed to zero, the
    result rounded back to ``dtype`` (round to nearest even, as XLA converts); None where two
    different NaNs meet."""
    ws = [_wide(x) for x in xs]
    return None if _nans_differ(ws) else _flush(fn(*ws)).astype(dtype)


def _float_or_int(fn, dtypes):
    """``fn`` on XLA:CPU's terms for floats (:func:`_on_xla_terms`); integers as they are."""
    def rule(xs, out, **_):
        if xs[0].dtype not in dtypes:
            return None
        return _on_xla_terms(fn, xs, out.dtype) if xs[0].dtype in FLOATS else fn(*xs)
    return rule


def _div(xs, out, **_):
    """Float division; a divisor broadcast inside the equation (rank-equal size-1 axes, or a
    scalar) is what XLA's algebraic simplifier rewrites, ``a / broadcast(b)`` into
    ``a * broadcast(1 / b)`` (measured: 1 ulp apart from a / b). The reciprocal is rounded to
    the divisor's type, except bfloat16's, which XLA:CPU has already widened to float32."""
    a, b = xs
    if a.dtype not in FLOATS:
        return None
    if b.shape == out.shape:
        return _on_xla_terms(np.divide, xs, out.dtype)
    if b.dtype == bfloat16:
        return _on_xla_terms(lambda x, y: x * _flush(np.reciprocal(y)), xs, out.dtype)
    b = _on_xla_terms(np.reciprocal, [b], b.dtype)
    return _on_xla_terms(np.multiply, [a, b], out.dtype)


def _nans_differ(ws) -> bool:
    """Two different NaNs meet: which one comes out depends on the operand order of the machine
    instruction XLA's loop emits (measured: the left in a short array, the right in a long one),
    so those equations are left to XLA."""
    if len(ws) < 2:
        return False
    a, b = np.broadcast_arrays(*ws[:2])
    both = np.isnan(a) & np.isnan(b)
    if not both.any():
        return False
    return bool((a.view(f"u{a.itemsize}") != b.view(f"u{b.itemsize}"))[both].any())


def _bits(fn, dtypes):
    """Sign-bit and bitwise operations: no arithmetic, so no rounding or flushing."""
    return lambda xs, out, **_: fn(*xs) if xs[0].dtype in dtypes else None


def _float_max_min(a, b, is_max):
    """XLA:CPU's maximum/minimum on NaN-free floats: -0 is below +0. (Which NaN comes out of a
    NaN operand depends on how LLVM lowers the intrinsic for this CPU — measured: the other
    operand's sign decides — so equations with a NaN are left to XLA.)"""
    r = np.where((b > a) if is_max else (b < a), b, a)
    zeros = (a == 0) & (b == 0)
    sign = (np.signbit(a) & np.signbit(b)) if is_max else (np.signbit(a) | np.signbit(b))
    return np.where(zeros, np.where(sign, -0.0, 0.0).astype(a.dtype), r)


def _max_min(is_max):
    def rule(xs, out, **_):
        a, b = xs
        if a.dtype in FLOATS:
            a, b = _wide(a), _wide(b)
            if np.isnan(a).any() or np.isnan(b).any():
                return None
            return _float_max_min(a, b, is_max).astype(out.dtype)
        if a.dtype in INTS + BOOL:
            return (np.maximum if is_max else np.minimum)(a, b)
        return None
    return rule


def _integer_pow(xs, out, y, **_):
    """JAX's lowering: square-and-multiply from the low bit, reciprocal for negative powers."""
    (x,) = xs
    if x.dtype not in F32_64 + INTS or (y < 0 and x.dtype in INTS):
        return None
    if y == 0:
        return np.ones_like(x)
    if y == 1:
        return x  # JAX lowers x**1 to x itself: no multiply, so no flush
    x = _wide(x) if x.dtype in FLOATS else x
    acc, n = None, abs(y)
    while n:
        if n & 1:
            acc = x if acc is None else _flush(acc * x)
        n >>= 1
        if n:
            x = _flush(x * x)
    return _flush(np.reciprocal(acc)) if y < 0 else acc


def _shift(op, fill_negative):
    """Shifts by at least the bit width (or by a negative amount) give 0, or the sign for an
    arithmetic right shift; NumPy leaves those to C's undefined behaviour."""
    def rule(xs, out, **_):
        a, s = xs
        if a.dtype not in INTS:
            return None
        bits = a.dtype.itemsize * 8
        wide = (s < 0) | (s >= bits)
        safe = np.where(wide, 0, s).astype(a.dtype)
        negative = a.view(a.dtype.str.replace("u", "i")) < 0
        fill = np.where(negative, ~np.zeros_like(a), 0) if fill_negative else np.zeros_like(a)
        return np.where(wide, fill, op(a, safe))
    return rule


def _logical_right(a, s):
    u = a.dtype.str.replace("i", "u")
    return np.right_shift(a.view(u), s.astype(u)).view(a.dtype)


def _arithmetic_right(a, s):
    """XLA shifts the bits as a signed integer, unsigned types included."""
    i = a.dtype.str.replace("u", "i")
    return np.right_shift(a.view(i), s.astype(i)).view(a.dtype)


def _select_n(xs, out, **_):
    which, *cases = xs
    if which.dtype == np.bool_:
        return np.where(which, cases[1], cases[0]) if len(cases) == 2 else None
    return np.choose(which, cases) if which.dtype in INTS else None


def _convert(xs, out, new_dtype, **_):
    """Exact conversions only: from booleans and integers to anything but a narrower float than
    needed, and floats to wider floats."""
    (x,) = xs
    new = np.dtype(new_dtype)
    exact = (x.dtype in BOOL or x.dtype == new
             or (x.dtype in INTS and new in INTS)
             or (x.dtype in INTS + BOOL and new in F32_64 and x.dtype.itemsize < new.itemsize)
             or (x.dtype in (np.float16, bfloat16) and new == np.float32))
    if x.dtype in (np.float32, np.float16) and new == np.float64:
        return _wide(x).astype(new)  # widening is arithmetic on XLA:CPU: denormals are zero
    return x.astype(new) if exact else None


def _broadcast_in_dim(xs, out, shape, broadcast_dimensions, **_):
    (x,) = xs
    expanded = [1] * len(shape)
    for d, size in zip(broadcast_dimensions, x.shape):
        expanded[d] = size
    return np.broadcast_to(x.reshape(expanded), shape)


def _reshape(xs, out, new_sizes, dimensions=None, **_):
    return None if dimensions is not None else xs[0].reshape(new_sizes)


def _pad(xs, out, padding_config, **_):
    x, value = xs
    for axis, (lo, hi, interior) in enumerate(padding_config):
        if interior:
            n = x.shape[axis]
            spread = np.full(x.shape[:axis] + (n + (n - 1) * interior,) + x.shape[axis + 1:],
                             value, x.dtype) if n else x
            if n:
                index = [slice(None)] * x.ndim
                index[axis] = slice(None, None, interior + 1)
                spread[tuple(index)] = x
            x = spread
        grow = [(0, 0)] * x.ndim
        grow[axis] = (max(lo, 0), max(hi, 0))
        x = np.pad(x, grow, constant_values=value)
        crop = [slice(None)] * x.ndim
        crop[axis] = slice(max(-lo, 0), x.shape[axis] - max(-hi, 0))
        x = x[tuple(crop)]
    return x


def _slice(xs, out, start_indices, limit_indices, strides=None, **_):
    steps = strides or (1,) * len(start_indices)
    return xs[0][tuple(slice(a, b, s) for a, b, s in zip(start_indices, limit_indices, steps))]


RULES = {
    # data moves
    "broadcast_in_dim": _broadcast_in_dim,
    "reshape": _reshape,
    "squeeze": lambda xs, out, dimensions, **_: np.squeeze(xs[0], tuple(dimensions)),
    "transpose": lambda xs, out, permutation, **_: np.transpose(xs[0], permutation),
    "rev": lambda xs, out, dimensions, **_: np.flip(xs[0], tuple(dimensions)),
    "slice": _slice,
    "pad": _pad,
    "concatenate": lambda xs, out, dimension, **_: np.concatenate(xs, dimension),
    "select_n": _select_n,
    "copy": lambda xs, out, **_: xs[0].copy(),
    "copy_p": lambda xs, out, **_: xs[0].copy(),
    "convert_element_type": _convert,
    # correctly rounded arithmetic on XLA:CPU's terms (integers wrap in both)
    "add": _float_or_int(np.add, FLOATS + INTS),
    "add_any": _float_or_int(np.add, FLOATS + INTS),
    "sub": _float_or_int(np.subtract, FLOATS + INTS),
    "mul": _float_or_int(np.multiply, FLOATS + INTS),
    "div": _div,
    "sqrt": _float_or_int(np.sqrt, F32_64),
    "square": _float_or_int(np.square, F32_64 + INTS),
    "integer_pow": _integer_pow,
    "max": _max_min(True),
    "min": _max_min(False),
    "neg": _bits(np.negative, FLOATS + INTS),
    "abs": _bits(np.abs, FLOATS + INTS),
    # comparisons (floats read with denormals as zero) and bit logic
    "eq": _float_or_int(np.equal, ANY),
    "ne": _float_or_int(np.not_equal, ANY),
    "lt": _float_or_int(np.less, ANY),
    "le": _float_or_int(np.less_equal, ANY),
    "gt": _float_or_int(np.greater, ANY),
    "ge": _float_or_int(np.greater_equal, ANY),
    "and": _bits(np.bitwise_and, INTS + BOOL),
    "or": _bits(np.bitwise_or, INTS + BOOL),
    "xor": _bits(np.bitwise_xor, INTS + BOOL),
    "not": _bits(np.invert, INTS + BOOL),
    "shift_left": _shift(np.left_shift, False),
    "shift_right_arithmetic": _shift(_arithmetic_right, True),
    "shift_right_logical": _shift(_logical_right, False),
}


class RuleMismatch(AssertionError):
    """An audited rule gave other bits than XLA (see :func:`audited`)."""


_AUDIT = [False]


@contextlib.contextmanager
def audited():
    """Inside, every rule's result is also computed by ``bind`` and compared bit for bit
    (RuleMismatch names the equation): how new primitives, shapes or XLA versions are checked
    on real programs (``tests/ir/test_numpy_rules.py`` runs fuzz programs this way)."""
    _AUDIT[0], before = True, _AUDIT[0]
    try:
        yield
    finally:
        _AUDIT[0] = before


def evaluate(eqn, invals) -> list | None:
    """``eqn``'s outputs computed by NumPy, or None where no rule applies (the caller binds)."""
    rule = RULES.get(eqn.primitive.name)
    if rule is None or eqn.primitive.multiple_results or not agrees_with_xla():
        return None
    got = _apply(rule, eqn, invals)
    if _AUDIT[0] and got is not None and not _xlas_bits(got, eqn, invals):
        raise RuleMismatch(f"numpy rule for {eqn} on {[np.shape(x) for x in invals]}: "
                           f"not XLA's bits")
    return got


def _xlas_bits(got, eqn, invals) -> bool:
    """Whether a rule's result ``got`` is what ``bind`` gives, bit for bit (dtype included)."""
    want = np.asarray(bind_equation(eqn, list(invals))[0])
    return got[0].dtype == want.dtype and got[0].tobytes() == want.tobytes()


def _apply(rule, eqn, invals) -> list | None:
    out = eqn.outvars[0].aval
    if any(isinstance(x, jax.core.Tracer) for x in invals) or not all(
            isinstance(a.dtype, np.dtype) and a.dtype in ANY
            for a in [v.aval for v in eqn.invars] + [out]):
        return None  # a tracer, a PRNG key or a token: JAX's own business
    xs = [np.asarray(x, v.aval.dtype) for x, v in zip(invals, eqn.invars)]
    shape = out.shape
    rebatched = any(x.shape != v.aval.shape for x, v in zip(xs, eqn.invars))  # ir.rebatch
    if rebatched and eqn.primitive.name in ELEMENTWISE:
        shape = np.broadcast_shapes(*(x.shape for x in xs))
        out = out.update(shape=shape)
    with np.errstate(all="ignore"):  # IEEE results (Inf, NaN) are the point, not a warning
        y = rule(xs, out, **eqn.params)
    if y is None:
        return None
    y = np.asarray(y)
    if rebatched and eqn.primitive.name not in ELEMENTWISE:
        shape = y.shape  # a move whose shape params ir.rebatch set for the rows kept
    if y.shape != shape or y.dtype != out.dtype:
        return None
    return [contiguous(y)]


TILE = 256              # a tiled copy's square side: source and destination rows stay in cache
TILED_ABOVE = 1 << 22   # bytes: smaller results are copied in one call


def contiguous(y: np.ndarray) -> np.ndarray:
    """``y`` in C order (a view of another layout copied; ``ascontiguousarray`` makes 0-d 1-d).
    A large transposed matrix is copied a tile at a time: ``ndarray.copy`` walks the source a
    column at a time, one cache miss per element (GPT-2's transposed embedding: its figures in
    docs/verification.md)."""
    if y.flags.c_contiguous:
        return y
    if y.ndim != 2 or y.nbytes < TILED_ABOVE:
        return y.copy()
    out = np.empty(y.shape, y.dtype)
    rows, cols = y.shape
    for i in range(0, rows, TILE):
        for j in range(0, cols, TILE):
            out[i:i + TILE, j:j + TILE] = y[i:i + TILE, j:j + TILE]
    return out


@functools.cache
def agrees_with_xla() -> bool:
    """Whether this backend computes as the rules assume (denormals flushed, NaNs propagated,
    -0 below +0): checked once per process on a few equations, bit for bit. On another backend
    or CPU that differs the rules stay off and every equation runs through XLA."""
    sub = np.float32(np.finfo(np.float32).smallest_subnormal)
    x = np.array([sub, -sub, 0.0, -0.0, np.nan, 1.5, np.inf, 3.0], np.float32)
    y = np.array([0.0, sub, -0.0, 0.0, 1.0, -2.5, -np.inf, 7.0], np.float32)
    h = x.astype(np.float16)
    probes = [(lax.add, x, y), (lax.mul, x, y), (lax.div, h, h[::-1]), (lax.gt, x, y),
              (lax.max, x[:4], y[:4]), (lambda a: lax.integer_pow(a, 3), x),
              (lax.shift_right_arithmetic, np.int32([-9, 9, -1]), np.int32([1, 40, -1]))]
    if jax.config.jax_enable_x64:
        probes.append((lambda a: lax.convert_element_type(a, jnp.float64), x))
    for fn, *args in probes:
        eqn = jax.make_jaxpr(fn)(*args).jaxpr.eqns[0]
        got = _apply(RULES[eqn.primitive.name], eqn, list(args))
        if got is None or not _xlas_bits(got, eqn, args):
            return False
    return True
