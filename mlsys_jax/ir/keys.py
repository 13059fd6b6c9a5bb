"""Structural keys: one hasher for values, params and whole jaxprs, and a jaxpr's signature.

A key has two strengths, which differ only in how params that are code are keyed:

- ``strict=False`` answers "is this the same graph?" (``structural_hash``: fixpoint cycles, the
  search's explored set, the verifier's "unchanged" check). It must survive a re-trace, which
  makes new rule objects for every custom_jvp/vjp call: functions are keyed by qualified name,
  reprs without memory addresses.
- ``strict=True`` answers "may these two equations be merged?" (CSE, lecture §8.1). Functions
  and wrapped rules are keyed by identity, reprs keep addresses: two custom_jvp calls with the
  same body may carry different derivative rules (a factory of custom_jvp functions), and merging
  them would change gradients. Nested bodies are keyed with the same strictness.

Bodies are keyed by structure (variable names don't matter), constants and literals by value,
dtype and weak_type. A nested body's key is computed once per body object (jaxprs are never
mutated: JAX caches and shares them), so a graph is keyed in time linear in its top level.
"""
from __future__ import annotations

import hashlib
import re
import weakref

import jax
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Jaxpr, Literal

_ADDR = re.compile(r" at 0x[0-9a-f]+")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_PLAIN = frozenset({int, float, complex, bool, str, type(None)})
_REPRS: dict = {}       # dtypes and other small hashable values -> repr (computing one is slow)
_SHORT: dict = {}       # aval -> str_short()
_BODY_KEYS: dict = {}   # id(body) -> (weakref to it, {strict: digest})


def _memo(table: dict, key, make):
    try:
        hit = table.get(key)
    except TypeError:  # unhashable
        return make(key)
    if hit is None:
        hit = table[key] = make(key)
    return hit


def value_key(val, aval) -> str:
    """A constant or literal by value, dtype (``aval``'s; a Python scalar is read at that dtype),
    shape and weak_type. A PRNG key constant is read through its key data (NumPy cannot hold
    a key array)."""
    if jax.dtypes.issubdtype(getattr(val, "dtype", np.float32), jax.dtypes.prng_key):
        val = jax.random.key_data(val)
    arr = np.asarray(val)
    dtype = getattr(aval, "dtype", arr.dtype)
    if arr.dtype != dtype:
        try:
            arr = arr.astype(dtype)
        except (TypeError, ValueError):
            pass  # an extended dtype: its raw bytes and recorded dtype still tell values apart
    weak = int(bool(getattr(aval, "weak_type", False)))
    data = arr.tobytes()
    value = data.hex() if len(data) <= 16 else _digest(data)[:16]
    return f"{_memo(_REPRS, dtype, str)}{list(arr.shape)}:{weak}:{value}"


def _is_wrapped_fun(value) -> bool:
    return hasattr(value, "f") and hasattr(value, "transforms")  # JAX's lu.WrappedFun


def body_key(body, strict: bool) -> str:
    """The digest of a nested jaxpr's key, computed once per body object and strictness."""
    hit = _BODY_KEYS.get(id(body))
    if hit is None or hit[0]() is not body:
        ident = id(body)
        hit = _BODY_KEYS[ident] = (weakref.ref(body, lambda _: _BODY_KEYS.pop(ident, None)), {})
    digest = hit[1].get(strict)
    if digest is None:
        digest = hit[1][strict] = _digest(jaxpr_key(body, strict).encode())
    return digest


def param_key(value, strict: bool) -> str:
    """One param value as a string; see the module docstring for ``strict``."""
    kind = type(value)
    if kind in _PLAIN:
        return repr(value)
    if kind is tuple or kind is list:
        return "(" + ",".join([param_key(v, strict) for v in value]) + ")"
    if kind is np.dtype or isinstance(value, np.dtype):
        return _memo(_REPRS, value, repr)
    if isinstance(value, (ClosedJaxpr, Jaxpr)):
        return "{" + body_key(value, strict) + "}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(param_key(v, strict) for v in value) + ")"
    if isinstance(value, type):
        return f"<type {value.__module__}.{value.__qualname__}>"
    if strict and (callable(value) or _is_wrapped_fun(value)):
        return f"<fn {id(value)}>"
    if _is_wrapped_fun(value):  # not strict: by the function it wraps
        value = value.f
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<fn {value.__module__}.{value.__qualname__}>"
    return repr(value) if strict else _ADDR.sub("", repr(value))


def params_key(params: dict, strict: bool = True) -> str:
    """An equation's params as a string (sorted by name)."""
    return ";".join(f"{k}={param_key(v, strict)}" for k, v in sorted(params.items()))


def jaxpr_key(closed, strict: bool = False) -> str:
    """A jaxpr as text that is equal for structurally identical jaxprs (variable names aside)."""
    jaxpr = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    consts = getattr(closed, "consts", ())
    names: dict = {}

    def name(v) -> str:
        if isinstance(v, Literal):
            return f"lit({value_key(v.val, v.aval)})"
        if v not in names:
            names[v] = f"v{len(names)}"
        return names[v]

    if consts:
        cparts = [f"{name(v)}={value_key(c, v.aval)}" for v, c in zip(jaxpr.constvars, consts)]
    else:
        cparts = [name(v) for v in jaxpr.constvars]
    parts = ["c:" + ",".join(cparts)]
    parts.append("in:" + ",".join(
        f"{name(v)}:{_short(v.aval)}:{int(getattr(v.aval, 'weak_type', 0))}"
        for v in jaxpr.invars))
    for eqn in jaxpr.eqns:
        ins = ",".join([name(v) for v in eqn.invars])
        outs = ",".join([f"{name(v)}:{_short(v.aval)}" for v in eqn.outvars])
        parts.append(f"{outs}={eqn.primitive.name}[{params_key(eqn.params, strict)}]({ins})")
    parts.append("out:" + ",".join(name(v) for v in jaxpr.outvars))
    return "\n".join(parts)


def _short(aval) -> str:
    return _memo(_SHORT, aval, lambda a: a.str_short())


def structural_hash(closed) -> str:
    """A hash that is equal for structurally identical jaxprs (variable names don't matter)."""
    return _digest(jaxpr_key(closed, strict=False).encode())


def signature(closed) -> list:
    """``[inputs, outputs]``, each a list of (shape, dtype, weak_type): what rewrites keep."""
    j = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    return [[(tuple(v.aval.shape), str(v.aval.dtype), bool(getattr(v.aval, "weak_type", False)))
             for v in vs] for vs in (j.invars, j.outvars)]
