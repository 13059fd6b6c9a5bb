"""Which eager dispatches exact replay runs as their own program (lecture §8.4).

Eager JAX compiles each dispatch — one primitive, or one ``jit`` call — as its own XLA program.
A dispatch whose program holds a multiply-like op (multiply, a transcendental function, a
polynomial) and an ``add``/``subtract`` can round inside itself in ways that depend on how XLA
fuses it (LLVM contracts a multiply feeding an add into one FMA). Such a dispatch is a *unit*:
exact replay runs it as its own program — the same executable eager runs — rather than inside a
segment's program (``_compile.py``). Measured on XLA:CPU with segments compiled without fusion,
all of these differed from eager inside a segment: ``jnp.var`` (squares summed), ``polyval``,
``lax.erfc`` (one primitive, 55 HLO ops), ``gelu`` without the tanh approximation (through erfc).

The test reads the dispatch's own HLO (lowered once per primitive, parameters and types);
primitives that lower to one HLO op are known by name and never lowered.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import jax

from mlsys_jax.compat import ClosedJaxpr, Jaxpr

# Primitives that lower to one HLO instruction (or to none that rounds): never a unit.
SINGLE_OP = frozenset({
    "add", "sub", "mul", "div", "rem", "max", "min", "neg", "abs", "sign", "floor", "ceil",
    "round", "exp", "log", "log1p", "expm1", "tanh", "sin", "cos", "tan", "atan2", "sqrt",
    "rsqrt", "cbrt", "erf", "pow", "square", "is_finite", "nextafter", "dot_general",
    "conv_general_dilated", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod",
    "reduce_and", "reduce_or", "argmax", "argmin", "cumsum", "cumprod", "cummax", "cummin",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "select_n", "clamp",
    "convert_element_type", "broadcast_in_dim", "reshape", "squeeze", "expand_dims",
    "transpose", "slice", "rev", "dynamic_slice", "dynamic_update_slice", "concatenate", "pad",
    "gather", "scatter", "scatter-add", "copy", "copy_p", "iota", "stop_gradient",
    "optimization_barrier", "sharding_constraint", "shift_left", "shift_right_logical",
    "shift_right_arithmetic", "population_count", "sort", "random_bits", "random_seed",
    "random_wrap", "random_unwrap", "threefry2x32", "bitcast_convert_type", "reduce_precision",
    "real", "imag", "conj", "complex", "debug_callback", "split",
})
# HLO ops that cannot end in a multiply LLVM could contract into a following add.
NEUTRAL_HLO = frozenset({
    "parameter", "constant", "broadcast", "reshape", "tuple", "get-tuple-element", "convert",
    "compare", "select", "and", "or", "not", "xor", "bitcast-convert", "bitcast", "slice",
    "dynamic-slice", "dynamic-update-slice", "transpose", "iota", "copy", "concatenate", "pad",
    "gather", "scatter", "reverse", "abs", "negate", "maximum", "minimum", "sign", "floor",
    "ceil", "round-nearest-afz", "round-nearest-even", "is-finite", "divide", "sqrt",
    "remainder", "reduce", "reduce-window", "call", "conditional", "while", "clamp",
    "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt", "sort",
    "opt-barrier", "after-all", "add-dependency", "partition-id", "replica-id", "rng",
    "rng-bit-generator", "rng-get-and-update-state", "custom-call", "add", "subtract",
    "real", "imag", "complex", "reduce-precision",
})
ADDITIVE_HLO = frozenset({"add", "subtract"})
_OPCODE = re.compile(r"^\s*(?:ROOT\s+)?\S+\s=\s.*?\s([a-z][a-z0-9-]*)\(", re.M)


@dataclass(frozen=True)
class Traits:
    """What exact replay needs to know about one recorded dispatch."""

    unit: bool = False  # runs as its own program in exact mode
    size: int = 1  # primitives inside (bounds a program's size)


PLAIN = Traits()


def _bodies(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, Jaxpr):
                yield item


@lru_cache(maxsize=4096)
def _body_size(jaxpr) -> int:
    """Primitives in a jaxpr, recursively (cached: jnp's jaxprs are)."""
    return sum(1 + sum(_body_size(b) for b in _bodies(e.params)) for e in jaxpr.eqns)


def _from_hlo(prim, params, avals, size) -> Traits:
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
             for a in avals]
    try:
        hlo = jax.jit(lambda *a: prim.bind(*a, **params)).lower(*specs).as_text(dialect="hlo")
    except Exception:  # noqa: BLE001 - what cannot be inspected runs as eager runs it
        return Traits(True, size)
    ops = set(_OPCODE.findall(hlo))
    return Traits(bool(ops - NEUTRAL_HLO) and bool(ops & ADDITIVE_HLO), size)


@lru_cache(maxsize=8192)
def _cached(prim, params_key, avals, size):
    return _from_hlo(prim, dict(params_key), avals, size)


def classify(prim, params, avals) -> Traits:
    """The traits of one dispatch: a primitive by name, anything else by its HLO."""
    size = sum(_body_size(b) for b in _bodies(params)) or 1
    if size == 1 and prim.name in SINGLE_OP:
        return PLAIN
    try:
        key = tuple(sorted(params.items()))
        avals = tuple(avals)
        hash((key, avals))
    except TypeError:
        return _from_hlo(prim, params, avals, size)
    return _cached(prim, key, avals, size)
