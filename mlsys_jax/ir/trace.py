"""Turning user functions into ClosedJaxprs: the jaxpr is our computation graph (lecture §2.1)."""
from __future__ import annotations

import math
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
# XLA indexes buffers with signed 64-bit integers: no array holds more bytes than this.
MAX_ARRAY_BYTES = 2 ** 63 - 1


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
    shape, dtype = tuple(int(d) for d in dims), parse_dtype(m.group(1))
    nbytes = math.prod(shape) * itemsize(dtype)
    if nbytes > MAX_ARRAY_BYTES:
        raise MlsysError(f"shape spec {spec!r} is {nbytes:.3e} bytes, more than any array can hold "
                         "(2^63 - 1 bytes: XLA indexes with 64-bit integers); use smaller "
                         "dimensions")
    return jax.ShapeDtypeStruct(shape, dtype)


def as_abstract(x: Any):
    """An argument for tracing: spec strings are parsed, and so are strings in plain containers
    (dict, list, tuple: ``{"w": "f32[3,4]"}``); arrays keep their shape/dtype/weak_type. Inside
    any other pytree node (an equinox or flax module) a string is a static field (BatchNorm's
    ``axis_name``), never a spec."""
    if isinstance(x, str):
        return parse_spec(x)
    if type(x) is dict:
        return {k: as_abstract(v) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(as_abstract(v) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return type(x)(*(as_abstract(v) for v in x))
    return x


def itemsize(dtype) -> int:
    """Bytes per element. A PRNG key's dtype (``key<fry>``) is an extended dtype that NumPy
    cannot interpret; its own ``itemsize`` is its key data's (8 bytes for threefry)."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return int(dtype.itemsize)
    return np.dtype(dtype).itemsize


def aval_bytes(aval, cost_dtype=None) -> int:
    """Bytes of a value (a Python int: no overflow); with ``cost_dtype``, every floating tensor
    is costed as that dtype."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0  # tokens and other abstract values occupy no tensor memory
    if cost_dtype is not None and jnp.issubdtype(dtype, jnp.floating):
        dtype = cost_dtype
    return math.prod(int(d) for d in shape) * itemsize(dtype)


def is_traced_leaf(x, scalars: bool = True) -> bool:
    """Whether a pytree leaf is traced (an input of the jaxpr) rather than static (closed over):
    arrays, NumPy scalars and ShapeDtypeStructs are traced, and Python numbers when ``scalars``
    (as ``jax.make_jaxpr`` traces them); strings, callables and other objects are static."""
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return True
    return scalars and isinstance(x, (bool, int, float, complex))


def _in_plain_containers(path) -> bool:
    plain = (jax.tree_util.DictKey, jax.tree_util.SequenceKey)
    return all(isinstance(k, plain) for k in path)


def partition(tree, scalars: bool = True) -> tuple[list, Callable]:
    """Split a pytree into its traced leaves and a function rebuilding the tree from new values
    for them (static leaves kept): ``leaves, rebuild = partition(args); rebuild(tracers)``.

    With ``scalars``, Python numbers in plain containers (dict, list, tuple) are traced, as
    ``jax.make_jaxpr`` traces them; inside any other pytree node (an equinox or flax module)
    every non-array leaf is static, as ``equinox.filter_jit`` treats it (BatchNorm's
    ``inference`` flag, an activation function)."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    leaves = [leaf for _, leaf in flat]
    traced = [i for i, (path, leaf) in enumerate(flat)
              if is_traced_leaf(leaf, scalars and _in_plain_containers(path))]

    def rebuild(values):
        new = list(leaves)
        for i, v in zip(traced, values):
            new[i] = v
        return jax.tree_util.tree_unflatten(treedef, new)
    return [leaves[i] for i in traced], rebuild


def shape_str(aval) -> str:
    """``f32[32,784]``: the short text of an abstract value."""
    return aval.str_short(short_dtypes=True)


def random_inputs(specs, seed: int = 0):
    """Seeded random values for ShapeDtypeStructs (for the CLI and checks that need values);
    a PRNG key spec gets keys made from the seed."""
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        s = as_abstract(s)
        if jax.dtypes.issubdtype(s.dtype, jax.dtypes.prng_key):
            count = math.prod(s.shape)
            keys = jax.random.split(jax.random.key(seed), max(count, 1))[:count]
            out.append(keys.reshape(s.shape))
            continue
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
    """Trace ``fn(*args, **kwargs)`` keeping pytree structure. Args may be arrays, specs or
    structs, and pytrees of them with static leaves (:func:`partition`): the jaxpr's inputs are
    the traced leaves, in flattening order."""
    dynamic, rebuild = partition((as_abstract(args), as_abstract(kwargs)))

    def flat(*values):
        a, kw = rebuild(values)
        return fn(*a, **kw)
    closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*dynamic)
    in_tree = jax.tree_util.tree_structure((args, kwargs))
    return Traced(closed, in_tree, jax.tree_util.tree_structure(out_shape))


def trace(fn: Callable, *args, **kwargs) -> ClosedJaxpr:
    """The ClosedJaxpr of ``fn(*args)``: ``trace(f, 'f32[32,784]')`` or ``trace(f, x, W)``.

    >>> import jax.numpy as jnp
    >>> closed = trace(lambda x, w: jnp.tanh(x @ w), "f32[32,784]", "f32[784,10]")
    >>> [e.primitive.name for e in closed.jaxpr.eqns], closed.out_avals[0].shape
    (['dot_general', 'tanh'], (32, 10))
    """
    return trace_tree(fn, *args, **kwargs).closed


def input_structs(closed: ClosedJaxpr) -> list[jax.ShapeDtypeStruct]:
    """ShapeDtypeStructs (weak_type kept) for the inputs of a jaxpr: what re-tracing needs."""
    return [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
            for v in closed.jaxpr.invars]
