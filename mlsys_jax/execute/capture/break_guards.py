"""Guards of graph-break capture: what Python asked for at a break, and how a replay checks it.

A break's *guard key* is the concrete value Python received (the branch it took). torch.compile
guards float constants by value including sign; here keys go further and compare floats by bit
pattern — ``0.0 == -0.0`` in Python and NumPy, but ``1 / x`` tells them apart — and NaN payloads
with them. A one-program replay (``one_program.py``) checks a guard on the device: a ``bool`` guard by
the predicate itself, a scalar guard (``int``, ``float``, ``item``, ``__index__``) by the bit
pattern of the array value that produced a known outcome.
"""
from __future__ import annotations

import struct
import sys

import jax
import jax.numpy as jnp
import numpy as np

CONVERT = {  # bool/int/float through NumPy: the same value, cheaper than jax.Array's own
    "bool": lambda v, *a: bool(np.asarray(v)), "int": lambda v, *a: int(np.asarray(v)),
    "float": lambda v, *a: float(np.asarray(v)),
    "complex": lambda v, *a: complex(v), "index": lambda v, *a: v.__index__(),
    "item": lambda v, *a: v.item(*a), "tolist": lambda v, *a: v.tolist(),
    "array": lambda v, *a: np.asarray(v),
    "str": lambda v, *a: str(v), "repr": lambda v, *a: repr(v), "format": lambda v, *a: format(v, *a),
}
TEXT_KINDS = frozenset({"str", "repr", "format"})  # Python consumes text: not replayable
VALUE_KINDS = frozenset({"int", "index", "float", "item"})  # checked on device by bit pattern


def value_key(v):
    """A hashable key of a Python value that tells -0.0 from 0.0 and NaNs apart."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, int):
        return ("i", v)
    if isinstance(v, float):
        return ("f", struct.pack("<d", v))
    if isinstance(v, complex):
        return ("c", struct.pack("<dd", v.real, v.imag))
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, tuple(map(value_key, v)))
    if isinstance(v, np.generic):
        return ("np", v.dtype.str, v.tobytes())
    return ("v", v)


def guard_key(kind, py):
    """The cache key of a break's concrete value (arrays by bytes, text kinds not replayable)."""
    if kind in TEXT_KINDS:
        return (kind, None)
    if kind == "array":
        return (kind, py.shape, py.dtype.str, py.tobytes())
    return (kind, value_key(py))


def checkable_on_device(kind, aval) -> bool:
    """Whether a one-program replay can check this guard without reading it on the host."""
    if kind not in VALUE_KINDS | {"bool"} or int(np.prod(aval.shape)) != 1:
        return False
    dtype = aval.dtype
    return not (jax.dtypes.issubdtype(dtype, jax.dtypes.extended)
                or jnp.issubdtype(dtype, jnp.complexfloating))


def raw_bits(value) -> int:
    """The bit pattern of a one-element array, as the device-side check computes it."""
    return int.from_bytes(np.asarray(value).tobytes(), sys.byteorder)


def device_predicate(guard):
    """Traced: what ``bool()`` of a one-element array gives (``v != 0``, as NumPy: NaN is true,
    -0.0 false)."""
    g = guard.reshape(())
    return g if g.dtype == jnp.bool_ else g != 0


def device_index(guard, table, miss: int):
    """Traced: the branch index of a scalar guard, matched by the bit pattern of its value;
    ``table`` is ((bit pattern, index), ...); no match gives ``miss``."""
    g = guard.reshape(())
    if g.dtype == jnp.bool_:
        v = g.astype(jnp.uint8)
    else:
        v = jax.lax.bitcast_convert_type(g, jnp.dtype(f"uint{8 * g.dtype.itemsize}"))
    idx = jnp.int32(miss)
    for match, i in table:
        idx = jnp.where(v == np.asarray(match, v.dtype), jnp.int32(i), idx)
    return idx
