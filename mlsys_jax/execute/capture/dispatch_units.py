"""Which eager dispatches exact replay runs as their own program (lecture §8.4).

Eager JAX compiles each dispatch — one primitive, or one ``jit`` call — as its own XLA program.
A dispatch holding a multiply-like op (multiply, dot, a transcendental function, a polynomial)
and an add or subtract can round inside itself in ways that depend on how XLA fuses it (LLVM
contracts a multiply feeding an add into one FMA). Such a dispatch is a *unit*: exact replay runs
it as its own program — the same executable eager runs — rather than inside a segment's program
(``exact_programs.py``). Measured on XLA:CPU with segments compiled without fusion, all of these
differed from eager inside a segment: ``jnp.var`` (squares summed), ``polyval``, ``lax.erfc``
(one primitive, 55 HLO ops), ``gelu`` without the tanh approximation (through erfc).

Primitives that lower to one HLO op are known by name; a call's body is judged by its
primitives, recursively; any other primitive (``erfc``, ``logistic``, ``integer_pow``...) by its
own HLO, lowered once per primitive, parameters and types.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import jax

from mlsys_jax.compat import ClosedJaxpr, Jaxpr

# Primitives that lower to one HLO op, by what they do: multiply-like (a result that may end in a
# multiply), additive, or neither (data movement, comparison, selection, division, roots...).
MULTIPLY_LIKE = frozenset({
    "mul", "dot_general", "conv_general_dilated", "exp", "log", "log1p", "expm1", "tanh", "sin",
    "cos", "tan", "atan2", "rsqrt", "cbrt", "erf", "pow", "square", "reduce_prod", "cumprod",
})
ADDITIVE = frozenset({"add", "sub", "add_any", "reduce_sum", "cumsum", "nextafter"})
NEITHER = frozenset({
    "div", "rem", "max", "min", "neg", "abs", "sign", "floor", "ceil", "round", "sqrt",
    "is_finite", "reduce_max", "reduce_min", "reduce_and", "reduce_or", "argmax", "argmin",
    "cummax", "cummin", "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor",
    "select_n", "clamp", "convert_element_type", "broadcast_in_dim", "reshape", "squeeze",
    "expand_dims", "transpose", "slice", "rev", "dynamic_slice", "dynamic_update_slice",
    "concatenate", "pad", "gather", "scatter", "copy", "copy_p", "iota", "stop_gradient",
    "optimization_barrier", "sharding_constraint", "shift_left", "shift_right_logical",
    "shift_right_arithmetic", "population_count", "sort", "random_bits", "random_seed",
    "random_wrap", "random_unwrap", "threefry2x32", "bitcast_convert_type", "reduce_precision",
    "real", "imag", "conj", "complex", "debug_callback", "split", "pjit", "jit", "cond", "while",
    "scan", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "remat",
    "checkpoint", "select_and_scatter_add", "reduce_window_max",
})
# HLO ops that are neither multiply-like nor additive (for primitives lowered to several ops).
NEUTRAL_HLO = frozenset({
    "parameter", "constant", "broadcast", "reshape", "tuple", "get-tuple-element", "convert",
    "compare", "select", "and", "or", "not", "xor", "bitcast-convert", "bitcast", "slice",
    "dynamic-slice", "dynamic-update-slice", "transpose", "iota", "copy", "concatenate", "pad",
    "gather", "scatter", "reverse", "abs", "negate", "maximum", "minimum", "sign", "floor",
    "ceil", "round-nearest-afz", "round-nearest-even", "is-finite", "divide", "sqrt",
    "remainder", "reduce", "reduce-window", "call", "conditional", "while", "clamp",
    "shift-left", "shift-right-logical", "shift-right-arithmetic", "popcnt", "sort",
    "opt-barrier", "after-all", "add-dependency", "partition-id", "replica-id", "rng",
    "rng-bit-generator", "rng-get-and-update-state", "custom-call", "real", "imag", "complex",
    "reduce-precision",
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


def _from_hlo(prim, params, avals) -> tuple[bool, bool]:
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
             for a in avals]
    try:
        hlo = jax.jit(lambda *a: prim.bind(*a, **params)).lower(*specs).as_text(dialect="hlo")
    except Exception:  # noqa: BLE001 - what cannot be inspected runs as eager runs it
        return True, True
    ops = set(_OPCODE.findall(hlo))
    return bool(ops - NEUTRAL_HLO - ADDITIVE_HLO), bool(ops & ADDITIVE_HLO)


@lru_cache(maxsize=8192)
def _cached_hlo(prim, params_key, avals):
    return _from_hlo(prim, dict(params_key), avals)


def _facts(prim, params, avals) -> tuple[bool, bool]:
    """(multiply-like, additive) of one primitive application."""
    name = prim.name
    if name in MULTIPLY_LIKE or name in ADDITIVE or name in NEITHER:
        own = (name in MULTIPLY_LIKE, name in ADDITIVE)
        inner = [_body_facts(b) for b in _bodies(params)]
        return (own[0] or any(m for m, _ in inner), own[1] or any(a for _, a in inner))
    try:
        key, avals = tuple(sorted(params.items())), tuple(avals)
        hash((key, avals))
    except TypeError:
        return _from_hlo(prim, params, avals)
    return _cached_hlo(prim, key, avals)


@lru_cache(maxsize=4096)
def _body_facts(jaxpr) -> tuple[bool, bool]:
    facts = [_facts(e.primitive, e.params, [v.aval for v in e.invars]) for e in jaxpr.eqns]
    return any(m for m, _ in facts), any(a for _, a in facts)


@lru_cache(maxsize=4096)
def _body_size(jaxpr) -> int:
    """Primitives in a jaxpr, recursively (cached: jnp's jaxprs are)."""
    return sum(1 + sum(_body_size(b) for b in _bodies(e.params)) for e in jaxpr.eqns)


# ``max(y, y)`` inside a program is folded to ``y`` by XLA's simplifier; eager's dispatch gets
# ``y`` as two parameters and runs the max instruction, which reads a subnormal as zero
# (denormals-are-zero on XLA:CPU). A dispatch given one value twice that holds these runs alone.
SAME_OPERAND_FOLDED = frozenset({"max", "min"})


def folds_repeated(prim, params) -> bool:
    """Whether a dispatch given the same value as two operands may round otherwise inside a
    program (a max or min in it, or in its body)."""
    return prim.name in SAME_OPERAND_FOLDED or any(_body_folds(b) for b in _bodies(params))


@lru_cache(maxsize=4096)
def _body_folds(jaxpr) -> bool:
    return any(e.primitive.name in SAME_OPERAND_FOLDED or any(_body_folds(b) for b in
                                                               _bodies(e.params))
               for e in jaxpr.eqns)


def classify(prim, params, avals) -> Traits:
    """The traits of one dispatch."""
    size = sum(_body_size(b) for b in _bodies(params)) or 1
    if size == 1 and (prim.name in MULTIPLY_LIKE or prim.name in ADDITIVE
                      or prim.name in NEITHER):
        return PLAIN
    multiply_like, additive = _facts(prim, params, avals)
    return Traits(multiply_like and additive, size)
