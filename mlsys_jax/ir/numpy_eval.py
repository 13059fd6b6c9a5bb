"""Equations computed by NumPy to their dtype's rounding — not XLA's bits — with no kernel to compile.

Translation validation (``passes/validate.py``) runs a rewrite's region and its replacement
several times, in float64 and in the program's dtypes, and judges closeness in float64 and
finiteness in the program's dtypes: no bit needs to be XLA's. Binding through XLA would compile a
kernel for every new (primitive, shape, dtype), which at the size of a test or a fuzz program is
most of the cost; NumPy computes these primitives directly, in the precision XLA:CPU computes them
(16-bit floats in float32, rounded back; integers in int64, wrapped back to their width).
``ir/numpy_rules.py`` is the other NumPy table: exact XLA bits, for the bitwise oracle.
A conv is one product of the matrix of its windows with its kernel where that matrix is modest
(``WINDOWS_ELEMENTS``: a crop's few windows of a real model's kernel): a BLAS product, 2–3× faster
than XLA:CPU's conv kernel there. In float32 (ungrouped) it computes as that kernel does:
float32 sums, subnormals flushed (BLAS computes them, ten times slower on the special values'
draw). A float64 product widens a narrower kernel a block at a time, in cache
(:func:`_wide_product`), and a float32 one may compute its float64 twin in the same pass over the
kernel (:func:`conv_twins`): reading the kernel is what such a product costs. Otherwise NumPy's
tap-by-tap conv costs more than XLA's kernel, whose compile JAX caches per shape (a search
validates the same conv many times), so such convs (a large 16-bit one too: XLA's kernel on its
own dtypes) and dot_generals above ``NUMPY_MACS`` multiply-adds are left to XLA.
"""
from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

from mlsys_jax.compat import Tracer
from mlsys_jax.ir.widen import is_float

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
CONV = "conv_general_dilated"
NUMPY_MACS = 2_000_000  # above: XLA's kernel (one compile per shape) beats NumPy's contraction
# A conv's matrix of windows (``_by_windows``) up to this many elements: one BLAS product beats
# XLA:CPU's conv kernel on a crop's few windows of a large kernel, and holds 32 MiB in float64
WINDOWS_ELEMENTS = 1 << 22
TINY32 = np.finfo(np.float32).tiny  # below it a float32 is subnormal: XLA:CPU flushes it to zero
# A float64 product with narrower float weights widens this many bytes of them at a time (in cache)
WIDE_ROWS_BYTES = 1 << 20


def compute_dtype(dtype) -> np.dtype:
    """The dtype XLA:CPU computes ``dtype`` in: float32 for 16-bit floats, int64 for integers."""
    dtype = np.dtype(dtype)
    if is_float(dtype):
        return F64 if dtype == F64 else F32
    if np.issubdtype(dtype, np.integer):
        return np.dtype(np.int64)
    return dtype


def _broadcast(x, shape, broadcast_dimensions, **_):
    expanded = [1] * len(shape)
    for i, d in enumerate(broadcast_dimensions):
        expanded[d] = np.shape(x)[i]
    return np.broadcast_to(np.reshape(x, expanded), tuple(shape))


def _dot(a, b, dimension_numbers, **_):
    (lc, rc), (lb, rb) = dimension_numbers
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    la = [next(letters) for _ in range(np.ndim(a))]
    ra = [next(letters) for _ in range(np.ndim(b))]
    for i, j in list(zip(lc, rc)) + list(zip(lb, rb)):
        ra[j] = la[i]
    out = [la[i] for i in lb] + [la[i] for i in range(len(la)) if i not in lc and i not in lb]
    out += [ra[j] for j in range(len(ra)) if j not in rc and j not in rb]
    return np.einsum(f"{''.join(la)},{''.join(ra)}->{''.join(out)}", a, b, optimize=True)


def _dilate(x, factors):
    """``x`` (N, C, spatial...) with ``factor - 1`` zeros between elements of each spatial axis."""
    if all(f == 1 for f in factors):
        return x
    shape = x.shape[:2] + tuple((n - 1) * f + 1 if n else 0 for n, f in zip(x.shape[2:], factors))
    out = np.zeros(shape, x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(None, None, f) for f in factors)] = x
    return out


def _pad(x, spatial: list):
    """``x`` (N, C, spatial...) with zeros around each spatial axis (``np.pad``'s result, at a
    tenth of its cost on a crop)."""
    if not any(lo or hi for lo, hi in spatial):
        return x
    out = np.zeros(x.shape[:2] + tuple(n + lo + hi for n, (lo, hi) in zip(x.shape[2:], spatial)),
                   x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(lo, lo + n) for n, (lo, _) in
                                           zip(x.shape[2:], spatial))] = x
    return out


def _conv(x, w, *, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
          feature_group_count, batch_group_count, twin=False, **_):
    """lax.conv_general_dilated as one matrix product of its windows (:func:`_by_windows`)
    where they fit ``WINDOWS_ELEMENTS`` — in float64, or in float32 ungrouped; else tap by tap
    where it is small (``NUMPY_MACS``), else None (XLA's kernel). ``twin``: a float32 conv of
    windows and its float64 twin, ``[float32, float64]`` (:func:`conv_twins`), else None."""
    if batch_group_count != 1:
        return None
    dn = dimension_numbers
    x, w = x.transpose(dn.lhs_spec), w.transpose(dn.rhs_spec)  # (N, C, ..), (O, I, ..)
    kernel = w.shape[2:]
    # the image's length along each axis dilated and padded (negative padding crops), and the
    # output's: the way is chosen before any copy of the image is made
    padded = [max(0, ((m - 1) * f + 1 if m else 0) + lo + hi)
              for m, f, (lo, hi) in zip(x.shape[2:], lhs_dilation, padding)]
    out_sp = tuple(max(0, (m - (k - 1) * r - 1) // s + 1) for m, k, r, s in
                   zip(padded, kernel, rhs_dilation, window_strides))
    n, g, o, i = x.shape[0], feature_group_count, w.shape[0], w.shape[1]
    dtype = np.result_type(x.dtype, w.dtype)
    fits = n * math.prod(out_sp) * g * i * math.prod(kernel) <= WINDOWS_ELEMENTS
    windows = fits and (dtype == F64 or (x.dtype == w.dtype == F32 and g == 1))
    if twin and not (windows and dtype == F32 and all(out_sp)):
        return None
    if not all(out_sp):
        return np.transpose(np.zeros((n, o) + out_sp, dtype), np.argsort(dn.out_spec))
    if not windows and n * math.prod(out_sp) * o * i * math.prod(kernel) > NUMPY_MACS:
        return None
    x = _pad(_dilate(x, lhs_dilation), [(max(lo, 0), max(hi, 0)) for lo, hi in padding])
    x = x[(slice(None), slice(None)) + tuple(
        slice(max(-lo, 0), m - max(-hi, 0)) for (lo, hi), m in zip(padding, x.shape[2:]))]
    back = tuple(np.argsort(dn.out_spec))  # (N, C, spatial...) to the output's layout
    if windows:
        outs = _by_windows(x, w, g, kernel, out_sp, window_strides, rhs_dilation, back, twin=twin)
    else:
        outs = [_by_taps(x, w, g, kernel, out_sp, window_strides, rhs_dilation).reshape(
            (n, o) + out_sp).transpose(back)]
    return outs if twin else outs[0].astype(dtype, copy=False)


def _by_windows(x, w, g, kernel, out_sp, strides, dilation, back, *, twin=False) -> list:
    """The conv (``x`` padded (N, C, ...), ``w`` (O, I, ...)) as a product of a matrix of its
    windows (a row per output position, per group) with the kernel's: one BLAS call a group,
    faster than XLA:CPU's conv kernel where the windows are few and the kernel large (a
    validation's crop of a real model's conv). ``[output]``, or with ``twin`` (float32,
    ungrouped) ``[output, its float64 twin]``, each laid out as ``back`` permutes
    (N, C, spatial...)."""
    n, o, i = x.shape[0], w.shape[0], w.shape[1]
    d = len(kernel)
    sp = x.strides[2:]  # the windows, a view: (N, C, *out_sp, *kernel)
    win = as_strided(x, x.shape[:2] + out_sp + kernel, x.strides[:2]
                     + tuple(a * s for a, s in zip(sp, strides))
                     + tuple(a * r for a, r in zip(sp, dilation)), writeable=False)
    win = win.reshape((n, g, i) + out_sp + kernel)
    # rows (N, *out_sp), then the group, then (*kernel, I): the order of an HWIO kernel's
    # elements, so its matrix is the kernel itself, not a transposed copy of it
    spatial, taps = tuple(range(3, 3 + d)), tuple(range(3 + d, 3 + 2 * d))
    rows, depth = n * math.prod(out_sp), i * math.prod(kernel)
    cols = np.ascontiguousarray(win.transpose((0,) + spatial + (1,) + taps + (2,)))
    weights = w.reshape((g, o // g, i) + kernel).transpose((0,) + tuple(range(3, 3 + d)) + (2, 1))
    if g == 1:  # (float32: ungrouped, _conv)
        a, m = cols.reshape(rows, depth), weights.reshape(depth, o)
        if twin:
            outs = list(_wide_product(a.astype(F64), m, narrow=a))
        elif a.dtype == F32:
            outs = [_f32_product(a, m)]
        else:
            outs = [_wide_product(a, m) if m.dtype != a.dtype else a @ m]
        outs = [out[None] for out in outs]
    else:
        outs = [np.matmul(cols.reshape(rows, g, depth).transpose(1, 0, 2),
                          weights.reshape(g, depth, o // g))]  # (g, rows, o // g)
    nc = (0, d + 1) + tuple(range(1, d + 1))  # (N, *out_sp, O) to (N, O, *out_sp)
    order = tuple(nc[j] for j in back)
    return [out.transpose(1, 0, 2).reshape((n,) + out_sp + (o,)).transpose(order)
            for out in outs]


def _flushed(a):
    """``a`` with its subnormals zero, as XLA:CPU reads them (flush to zero)."""
    return np.where(np.abs(a) < TINY32, a.dtype.type(0), a)


def _flush_result(out):
    out[np.abs(out) < TINY32] = 0
    return out


def _f32_product(a, w):
    """``a @ w`` in float32 as XLA:CPU computes a conv's sums: float32, ``a``'s subnormals and
    the result's zero — BLAS computes subnormals, ten times slower on the special values'
    draw. (Partial sums that are subnormal, which XLA flushes one by one, add up here: a
    difference under the number of terms times float32's smallest normal, far below what
    validation judges in float32 — finiteness, and the rounding error of whole outputs.)"""
    return _flush_result(_flushed(a) @ w)


def _wide_product(a, w, narrow=None):
    """``a @ w`` in ``a``'s float64, ``w`` a narrower float matrix widened ``WIDE_ROWS_BYTES``
    at a time into one buffer that stays in cache: its whole float64 copy would be written to
    memory and read back, at three times the bytes of the read of ``w`` itself. ``narrow``:
    also :func:`_f32_product` of it, in the same pass (each block of ``w`` read once for both):
    ``(float32 product, float64 product)``."""
    depth, o = w.shape
    step = max(1, WIDE_ROWS_BYTES // (F64.itemsize * o))
    low = None if narrow is None else _flushed(narrow)
    if step >= depth:
        out = a @ w.astype(F64)
        return out if low is None else (_flush_result(low @ w), out)
    buf = np.empty((step, o), F64)
    out = part = low_out = None
    for start in range(0, depth, step):
        block, cols = w[start:start + step], slice(start, start + step)
        if low is not None:
            p = low[:, cols] @ block
            low_out = p if low_out is None else np.add(low_out, p, out=low_out)
        wide = buf[:len(block)]
        np.copyto(wide, block)
        if out is None:
            out = a[:, cols] @ wide
            part = np.empty_like(out)
        else:
            out += np.matmul(a[:, cols], wide, out=part)
    return out if low is None else (_flush_result(low_out), out)


def _by_taps(x, w, g, kernel, out_sp, strides, dilation):
    """The conv tap by tap: each tap of the kernel one contraction (no window matrix)."""
    n, o, i = x.shape[0], w.shape[0], w.shape[1]
    out = np.zeros((n, g, o // g) + out_sp, np.result_type(x.dtype, w.dtype))
    for tap in np.ndindex(*kernel):
        sl = tuple(slice(t * r, t * r + (m - 1) * s + 1, s) for t, r, m, s in
                   zip(tap, dilation, out_sp, strides))
        patch = x[(slice(None), slice(None)) + sl].reshape((n, g, i) + out_sp)
        taps = w[(slice(None), slice(None)) + tap].reshape(g, o // g, i)
        out += np.einsum("ngi...,goi->ngo...", patch, taps, optimize=True)
    return out


def _convert(x, new_dtype, **_):
    return x if is_float(new_dtype) or not is_float(x.dtype) else None  # float→int: XLA's rule


OPS = {
    "add": np.add, "add_any": np.add, "sub": np.subtract, "mul": np.multiply,
    "div": np.divide, "neg": np.negative, "abs": np.abs, "max": np.maximum,
    "min": np.minimum, "sqrt": np.sqrt, "rsqrt": lambda x, **_: 1.0 / np.sqrt(x),
    "square": np.square, "exp": np.exp, "log": np.log, "tanh": np.tanh,
    "logistic": lambda x, **_: 1.0 / (1.0 + np.exp(-x)), "sin": np.sin, "cos": np.cos,
    "stop_gradient": lambda x, **_: x, "copy": lambda x, **_: np.array(x),
    "broadcast_in_dim": _broadcast, "convert_element_type": _convert,
    "reshape": lambda x, new_sizes, dimensions=None, **_: np.reshape(x, new_sizes)
    if dimensions is None else None,
    "squeeze": lambda x, dimensions, **_: np.squeeze(x, tuple(dimensions)),
    "transpose": lambda x, permutation, **_: np.transpose(x, permutation),
    "dot_general": _dot, CONV: _conv,
}
IGNORED = ("sharding", "out_sharding", "accuracy", "out_dtype", "weak_type", "precision",
           "preferred_element_type")


def macs(eqn) -> int:
    """Multiply-adds of a conv or dot_general (0 for anything else): the output's size times
    what each output element contracts."""
    name = eqn.primitive.name
    if name not in (CONV, "dot_general"):
        return 0
    out = math.prod(eqn.outvars[0].aval.shape)  # (math.prod: a tenth of np.prod's cost)
    rhs = eqn.invars[1].aval.shape
    if name == "dot_general":
        (_, rc), _ = eqn.params["dimension_numbers"]
        return out * math.prod(rhs[a] for a in rc)
    spec = eqn.params["dimension_numbers"].rhs_spec  # (out features, in features, spatial...)
    return out * math.prod(rhs[a] for a in spec[1:])


def evaluate(eqn, invals, out_dtype) -> list | None:
    """``eqn`` on ``invals`` as NumPy computes it, the result in ``out_dtype``; None where this
    table has no rule (the caller binds it through XLA)."""
    fn = OPS.get(eqn.primitive.name)
    if fn is None or eqn.primitive.multiple_results:
        return None
    if any(isinstance(x, Tracer) for x in invals):
        return None  # under a trace (a jitted float64 twin): JAX binds it
    xs = [np.asarray(x) for x in invals]
    if not all(is_float(x.dtype) or np.issubdtype(x.dtype, np.integer) for x in xs):
        return None
    ints = not any(is_float(x.dtype) for x in xs)
    if ints and eqn.primitive.name in ("div", "sqrt", "rsqrt", "exp", "log", "tanh", "logistic",
                                       "sin", "cos"):
        return None  # truncating division and the like: XLA's own rules
    wide = compute_dtype(np.result_type(*[x.dtype for x in xs]) if xs else out_dtype)
    if macs(eqn) > NUMPY_MACS and not (eqn.primitive.name == CONV and (
            wide == F64 or all(x.dtype == F32 for x in xs))):
        return None  # (a float64 or float32 conv decides by its windows: _conv; a large
        # 16-bit one is XLA's kernel on its own dtypes)
    xs = [x.astype(wide) if x.dtype != wide else x for x in xs]
    with np.errstate(all="ignore"):
        y = fn(*xs, **_numpy_params(eqn))
    if y is None:
        return None
    return [np.asarray(y).astype(out_dtype)]


def _numpy_params(eqn) -> dict:
    """``eqn``'s params as this table's rules take them (XLA's dtype and layout hints dropped)."""
    return {k: v for k, v in eqn.params.items() if k not in IGNORED}


def _concrete_conv(eqn, invals) -> tuple | None:
    """A conv's image and kernel as NumPy arrays, or None (another primitive, or traced)."""
    if eqn.primitive.name != CONV or any(isinstance(x, Tracer) for x in invals):
        return None
    return tuple(np.asarray(v) for v in invals)


def conv_widened(eqn, invals) -> list | None:
    """A conv in float64 on ``invals`` as the program holds them: the image widened, a narrower
    float kernel left so for its matrix of windows to widen a block at a time
    (:func:`_wide_product`); None where the kernel is not a narrower float or the conv is not
    NumPy's (the caller widens every operand and binds it)."""
    got = _concrete_conv(eqn, invals)
    if got is None:
        return None
    x, w = got
    if not (is_float(x.dtype) and is_float(w.dtype)) or w.dtype == F64:
        return None
    with np.errstate(all="ignore"):
        y = _conv(x if x.dtype == F64 else x.astype(F64), w, **_numpy_params(eqn))
    return None if y is None else [np.asarray(y, F64)]


def conv_twins(eqn, invals) -> tuple | None:
    """``([output], [float64 twin])``: a float32 conv that is one product of its windows, and
    the float64 conv of the same operands widened (what :func:`conv_widened` computes of them),
    in one pass over the kernel; None for any other equation (computed as usual)."""
    got = _concrete_conv(eqn, invals)
    if got is None:
        return None
    x, w = got
    if not x.dtype == w.dtype == F32 or eqn.outvars[0].aval.dtype != F32:
        return None
    with np.errstate(all="ignore"):
        got = _conv(x, w, twin=True, **_numpy_params(eqn))
    return None if got is None else ([got[0]], [got[1]])
