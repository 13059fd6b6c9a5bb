"""Per-primitive FLOP rules, in a table keyed by primitive name (autodidax style).

A rule takes the equation and returns its FLOPs. Bytes are not per rule: a kernel's bytes are its
external inputs read plus its outputs written (lecture §4.2), computed from avals in ``model.py``.
Primitives absent from every table are *unknown*: reported, never silently counted as zero.
"""
from __future__ import annotations

import math

from mlsys_jax.ir.primitives import (CALLS, COLLECTIVE_REDUCTIONS, CONTROL, ELEMENTWISE, FREE,
                                     MOVEMENT, REDUCTIONS, RNG_BITS)


def _size(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ())))


def _out(eqn) -> int:
    return sum(_size(v.aval) for v in eqn.outvars)


def _in0(eqn) -> int:
    return _size(eqn.invars[0].aval)


def _dot_general(eqn) -> int:
    (lhs_contract, _), _ = eqn.params["dimension_numbers"]
    k = math.prod(eqn.invars[0].aval.shape[d] for d in lhs_contract)
    return 2 * _out(eqn) * k


def _conv(eqn) -> int:
    # Each output element is a dot over the kernel's input features × window, whatever the
    # layout, strides, padding, dilation, feature or batch grouping (the gradient's forms too).
    rhs = eqn.invars[1].aval.shape
    out_feature_dim = eqn.params["dimension_numbers"].rhs_spec[0]
    return 2 * _out(eqn) * math.prod(rhs) // rhs[out_feature_dim]


def _reduce_window(eqn) -> int:
    return _out(eqn) * math.prod(eqn.params["window_dimensions"])


def _sort(eqn) -> int:
    n = _in0(eqn)
    dim = eqn.invars[0].aval.shape[eqn.params.get("dimension", -1)] if eqn.invars[0].aval.shape else 1
    return int(n * max(1.0, math.log2(max(dim, 2))))


def _scatter(eqn) -> int:
    return _size(eqn.invars[-1].aval)  # one add per update element


ZERO = lambda eqn: 0  # noqa: E731
PER_OUTPUT = _out
PER_INPUT = _in0

FLOP_RULES = {
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "reduce_window_sum": _reduce_window, "reduce_window_max": _reduce_window,
    "reduce_window_min": _reduce_window, "reduce_window": _reduce_window,
    "select_and_scatter_add": PER_INPUT, "scatter-add": _scatter, "scatter_add": _scatter,
    "scatter": ZERO, "scatter_mul": _scatter, "scatter_min": _scatter, "scatter_max": _scatter,
    "cumsum": PER_INPUT, "cumprod": PER_INPUT, "cummax": PER_INPUT, "cummin": PER_INPUT,
    "cumlogsumexp": PER_INPUT, "sort": _sort, "top_k": PER_INPUT,
}
# The classes of ir.primitives: per output element, per input element, or no arithmetic at all.
for _p in ELEMENTWISE | RNG_BITS:
    FLOP_RULES.setdefault(_p, PER_OUTPUT)
for _p in REDUCTIONS | COLLECTIVE_REDUCTIONS:
    FLOP_RULES.setdefault(_p, PER_INPUT)
for _p in MOVEMENT | FREE:
    FLOP_RULES[_p] = ZERO


def known(prim: str) -> bool:
    """Has a FLOP rule, or bodies whose FLOPs are counted (calls, control flow)."""
    return prim in FLOP_RULES or prim in CALLS or prim in CONTROL
