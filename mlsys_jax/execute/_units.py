"""Which eager dispatches exact replay runs alone, and which programs may keep XLA's fusion.

Eager JAX compiles each dispatch — one primitive, or one ``jit`` call — with XLA's fusion on.
Inside a fused loop LLVM contracts a multiply feeding an add into one FMA (one rounding instead
of two). Two consequences for exact replay (``_compile.py``), both read from a dispatch's own HLO
(lowered once per primitive, parameters and types; primitives that lower to one HLO op are
known by name):

- A dispatch whose program holds a multiply-like op (multiply, a transcendental function, a
  polynomial) and an ``add``/``subtract`` is a *unit*: eager fuses inside it, so exact replay runs
  it as its own program — the same executable eager runs. Measured on XLA:CPU: ``jnp.var``
  (squares summed), ``polyval``, ``lax.erfc`` (one primitive, 55 HLO ops), ``gelu`` without the
  tanh approximation (through erfc), ``logistic``.
- A program may keep fusion on only if no multiply-like result reaches an additive dispatch
  (``add``, ``sub``, ``reduce_sum``, ``cumsum``) through ops that pass a value on unchanged
  (reshape, broadcast, convert, negation, selection); and no ``dot`` feeds an ``add`` directly
  (XLA:CPU can fuse a bias add into a matrix–vector product). Otherwise the program is compiled
  with fusion off, and every dispatch is its own kernel, rounded as eager rounds it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import jax

from mlsys_jax.compat import ClosedJaxpr, Jaxpr

# Primitives that lower to one HLO instruction (or to none that rounds): never a unit alone,
# their traits known by name.
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
PASSTHROUGH_HLO = frozenset({"select", "convert", "negate", "clamp"})
MOVEMENT_HLO = frozenset({
    "parameter", "constant", "broadcast", "reshape", "tuple", "get-tuple-element", "bitcast",
    "slice", "dynamic-slice", "dynamic-update-slice", "transpose", "copy", "concatenate", "pad",
    "gather", "reverse", "iota", "call",
})
REGION_USERS = frozenset({"reduce", "reduce-window", "scatter", "select-and-scatter", "sort",
                          "map", "all-reduce", "reduce-scatter"})
_OPCODE = re.compile(r"^\s*(?:ROOT\s+)?\S+\s=\s.*?\s([a-z][a-z0-9-]*)\(")
_REGION = re.compile(r"(?:to_apply|select|scatter)=([\w.\-]+)")


def hlo_opcodes(hlo: str) -> tuple[set, set]:
    """(opcodes outside reduction regions, opcodes inside them) of an HLO module's text."""
    comps: dict[str, list] = {}
    regions, name = set(), None
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            comps[name] = []
            continue
        m = _OPCODE.match(line)
        if m and name is not None:
            comps[name].append(m.group(1))
            if m.group(1) in REGION_USERS:
                regions.update(_REGION.findall(line))
    outside = {op for c, ops in comps.items() if c not in regions for op in ops}
    inside = {op for c, ops in comps.items() if c in regions for op in ops}
    return outside, inside


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


MUL_LIKE = frozenset({
    "mul", "exp", "log", "log1p", "expm1", "tanh", "sin", "cos", "tan", "atan2", "rsqrt",
    "cbrt", "erf", "pow", "square", "reduce_prod", "cumprod",
})
DOT_LIKE = frozenset({"dot_general", "conv_general_dilated"})
ADDITIVE = frozenset({"add", "sub", "reduce_sum", "cumsum", "add_any"})
PASSTHROUGH = frozenset({
    "reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose", "convert_element_type",
    "neg", "copy", "copy_p", "slice", "rev", "pad", "concatenate", "gather", "dynamic_slice",
    "dynamic_update_slice", "select_n", "real", "imag", "complex", "conj", "clamp",
})
NO_MUL, MUL, DOT = 0, 1, 2  # what a dispatch's result may end in


@dataclass(frozen=True)
class Traits:
    """What exact replay needs to know about one recorded dispatch."""

    unit: bool = False  # runs as its own program in exact mode
    size: int = 1  # primitives inside (bounds a program's size)
    mul_like: int = NO_MUL  # MUL: may end in a multiply; DOT: a dot or convolution
    additive: bool = False  # adds or sums its inputs (a multiply feeding it may become an FMA)
    adds: bool = False  # adds elementwise (a dot feeding it may take it as an output fusion)
    passthrough: bool = False  # passes an input on unchanged (a multiply stays visible)


PLAIN = Traits()


def _from_hlo(prim, params, avals, size) -> Traits:
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
             for a in avals]
    try:
        hlo = jax.jit(lambda *a: prim.bind(*a, **params)).lower(*specs).as_text(dialect="hlo")
    except Exception:  # noqa: BLE001 - what cannot be inspected runs as eager runs it
        return Traits(True, size, MUL, True, True, True)
    outside, inside = hlo_opcodes(hlo)
    ops = outside | inside
    multiply = bool(ops - NEUTRAL_HLO - {"dot", "convolution"})
    mul_like = MUL if multiply else DOT if ops & {"dot", "convolution"} else NO_MUL
    additive = bool(ops & ADDITIVE_HLO)
    passthrough = bool(outside & PASSTHROUGH_HLO) or not outside - MOVEMENT_HLO
    return Traits(bool(ops - NEUTRAL_HLO) and additive, size, mul_like, additive,
                  bool(outside & ADDITIVE_HLO), passthrough)


@lru_cache(maxsize=8192)
def _cached(prim, params_key, avals, size):
    return _from_hlo(prim, dict(params_key), avals, size)


def classify(prim, params, avals) -> Traits:
    """The traits of one dispatch: a primitive by name, anything else by its HLO."""
    size = sum(_body_size(b) for b in _bodies(params)) or 1
    if size == 1 and prim.name in SINGLE_OP:
        name = prim.name
        return Traits(False, 1, MUL if name in MUL_LIKE else DOT if name in DOT_LIKE else NO_MUL,
                      name in ADDITIVE, name in ("add", "sub", "add_any"), name in PASSTHROUGH)
    try:
        key = tuple(sorted(params.items()))
        avals = tuple(avals)
        hash((key, avals))
    except TypeError:
        return _from_hlo(prim, params, avals, size)
    return _cached(prim, key, avals, size)


def fusion_safe(eqns_lists) -> bool:
    """Whether XLA may fuse these equations (segments along the paths of one program) without
    changing any rounding: no multiply reaches an additive dispatch, no dot feeds an add."""
    mul, dot = set(), set()
    for eqns in eqns_lists:
        for e in eqns:
            t = e.traits
            ins = [r for r in e.ins if r >= 0]
            if t.additive and any(r in mul for r in ins):
                return False
            if t.adds and any(r in dot for r in ins):
                return False
            if t.mul_like == MUL or (t.passthrough and any(r in mul for r in ins)):
                mul.update(e.outs)
            elif t.mul_like == DOT:
                dot.update(e.outs)
    return True
