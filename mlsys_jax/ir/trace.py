"""Turning user functions into ClosedJaxprs: the jaxpr is our computation graph (lecture §2.1)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.errors import MlsysError

DTYPES = {"f16": jnp.float16, "bf16": jnp.bfloat16, "f32": jnp.float32, "f64": jnp.float64,
          "i32": jnp.int32, "bool": jnp.bool_}
_SPEC = re.compile(r"^\s*([a-z0-9]+)\[([0-9,\s]*)\]\s*$")


def parse_dtype(name: str):
    """'bf16' -> jnp.bfloat16; an unknown name is an MlsysError listing the known ones."""
    try:
        return DTYPES[name.strip().lower()]
    except (KeyError, AttributeError):
        raise MlsysError(f"unknown dtype {name!r}; use one of {', '.join(DTYPES)}") from None


def parse_spec(spec: str) -> jax.ShapeDtypeStruct:
    """Parse an argument spec like ``f32[32,784]`` (``f32[]`` is a scalar) into a ShapeDtypeStruct."""
    m = _SPEC.match(spec) if isinstance(spec, str) else None
    if not m:
        raise MlsysError(f"malformed shape spec {spec!r}; expected DTYPE[d0,d1,...] such as "
                         f"f32[32,784] or f32[] (dtypes: {', '.join(DTYPES)})")
    dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
    if m.group(2).strip() and len(dims) != m.group(2).count(",") + 1:
        raise MlsysError(f"malformed shape spec {spec!r}: empty dimension")
    return jax.ShapeDtypeStruct(tuple(int(d) for d in dims), parse_dtype(m.group(1)))


def as_abstract(x: Any):
    """An argument for tracing: spec strings are parsed, arrays keep their shape/dtype/weak_type."""
    if isinstance(x, str):
        return parse_spec(x)
    return x


def aval_bytes(aval, cost_dtype=None) -> int:
    """Bytes of a value; with ``cost_dtype``, every floating tensor is costed as that dtype."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0  # tokens and other abstract values occupy no tensor memory
    if cost_dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        dtype = cost_dtype
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def shape_str(aval) -> str:
    """``f32[32,784]``: the short text of an abstract value."""
    return aval.str_short(short_dtypes=True)


def random_inputs(specs, seed: int = 0):
    """Seeded random values for ShapeDtypeStructs (for the CLI and checks that need values)."""
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        s = as_abstract(s)
        dt = np.dtype(s.dtype)
        if dt == np.bool_:
            val = rng.random(s.shape) > 0.5
        elif np.issubdtype(dt, np.integer):
            val = rng.integers(0, 10, size=s.shape)
        else:
            val = rng.standard_normal(s.shape)
        out.append(jnp.asarray(val, dtype=s.dtype))
    return out


@dataclass(frozen=True)
class Traced:
    """A traced function: its ClosedJaxpr and the pytree structures of inputs and outputs."""

    closed: ClosedJaxpr
    in_tree: Any
    out_tree: Any


def trace_tree(fn: Callable, *args, **kwargs) -> Traced:
    """Trace ``fn(*args, **kwargs)`` keeping pytree structure (args may be arrays, specs or structs)."""
    args = jax.tree_util.tree_map(as_abstract, args, is_leaf=lambda x: isinstance(x, str))
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args, **kwargs)
    in_tree = jax.tree_util.tree_structure((args, kwargs))
    return Traced(closed, in_tree, jax.tree_util.tree_structure(out_shape))


def trace(fn: Callable, *args, **kwargs) -> ClosedJaxpr:
    """The ClosedJaxpr of ``fn(*args)``: ``trace(f, 'f32[32,784]')`` or ``trace(f, x, W)``."""
    return trace_tree(fn, *args, **kwargs).closed


def input_structs(closed: ClosedJaxpr) -> list[jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs (weak_type kept) for the inputs of a jaxpr: what re-tracing needs."""
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
            for v in closed.jaxpr.invars]
