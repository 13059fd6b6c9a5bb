"""Walking jaxprs recursively, counting primitives, and hashing structure."""
from __future__ import annotations

import hashlib
import re
from collections import Counter
from typing import Iterator

import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Jaxpr, Literal, call_name, nested_jaxprs


def _open(j) -> Jaxpr:
    return j.jaxpr if isinstance(j, ClosedJaxpr) else j


def walk(closed, path: str = "") -> Iterator[tuple[str, object]]:
    """Yield ``(path, eqn)`` for every equation, recursively into nested bodies.

    Paths read like ``"3/jit[softmax_xent]/0"``: equation indices and, for nested bodies, the
    primitive with its name or param (``cond.branches[1]``, ``scan.jaxpr``, ``remat2.jaxpr``).
    """
    for i, eqn in enumerate(_open(closed).eqns):
        here = f"{path}{i}"
        yield here, eqn
        for pname, idx, sub, _ in nested_jaxprs(eqn):
            label = call_name(eqn)
            tag = (f"{eqn.primitive.name}[{label}]" if label
                   else f"{eqn.primitive.name}.{pname}" + (f"[{idx}]" if idx is not None else ""))
            yield from walk(sub, f"{here}/{tag}/")


def primitive_counts(closed, recursive: bool = True) -> Counter:
    """How many times each primitive appears (into nested bodies when ``recursive``)."""
    if recursive:
        return Counter(eqn.primitive.name for _, eqn in walk(closed))
    return Counter(eqn.primitive.name for eqn in _open(closed).eqns)


_ADDR = re.compile(r" at 0x[0-9a-f]+")


def _param_repr(value) -> str:
    if isinstance(value, (ClosedJaxpr, Jaxpr)):
        return "{" + _jaxpr_key(_open(value), getattr(value, "consts", ())) + "}"
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_param_repr(v) for v in value) + ")"
    if hasattr(value, "f") and hasattr(value, "transforms"):  # a WrappedFun: key by its function
        value = value.f
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<fn {value.__module__}.{value.__qualname__}>"
    return _ADDR.sub("", repr(value))


def _const_key(c) -> str:
    arr = np.asarray(c)
    return f"{arr.dtype}{arr.shape}:{hashlib.sha256(arr.tobytes()).hexdigest()[:16]}"


def _jaxpr_key(jaxpr: Jaxpr, consts=()) -> str:
    names: dict = {}

    def name(v) -> str:
        if isinstance(v, Literal):
            aval = v.aval
            return f"lit({np.asarray(v.val).tolist()!r}:{aval.dtype}:{int(aval.weak_type)})"
        if v not in names:
            names[v] = f"v{len(names)}"
        return names[v]

    if consts:
        cparts = [f"{name(v)}={_const_key(c)}" for v, c in zip(jaxpr.constvars, consts)]
    else:
        cparts = [name(v) for v in jaxpr.constvars]
    parts = ["c:" + ",".join(cparts)]
    parts.append("in:" + ",".join(f"{name(v)}:{v.aval.str_short()}:{int(getattr(v.aval, 'weak_type', 0))}"
                                  for v in jaxpr.invars))
    for eqn in jaxpr.eqns:
        params = ";".join(f"{k}={_param_repr(v)}" for k, v in sorted(eqn.params.items()))
        ins = ",".join(name(v) for v in eqn.invars)
        outs = ",".join(f"{name(v)}:{v.aval.str_short()}" for v in eqn.outvars)
        parts.append(f"{outs}={eqn.primitive.name}[{params}]({ins})")
    parts.append("out:" + ",".join(name(v) for v in jaxpr.outvars))
    return "\n".join(parts)


def structural_hash(closed) -> str:
    """A hash that is equal for structurally identical jaxprs (variable names don't matter)."""
    key = _jaxpr_key(_open(closed), getattr(closed, "consts", ()))
    return hashlib.sha256(key.encode()).hexdigest()
