"""Per-primitive FLOP rules, in a table keyed by primitive name (autodidax style).

A rule takes the equation and returns its FLOPs. Bytes are not per rule: a kernel's bytes are its
external inputs read plus its outputs written (lecture §4.2), computed from avals in ``model.py``.
Primitives absent from every table are *unknown*: reported, never silently counted as zero.
"""
from __future__ import annotations

import math

from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.ir.opview import ELEMENTWISE, REDUCTIONS


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

# Data movement and bookkeeping: no arithmetic.
MOVEMENT = frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "gather", "rev", "iota", "select_and_gather_add",
    "convert_element_type", "bitcast_convert_type", "copy", "copy_p", "stop_gradient", "split",
    "real", "imag", "reduce_precision", "squeeze_p", "device_put", "full_like",
    "all_gather", "all_to_all", "ppermute", "axis_index", "pbroadcast", "pvary", "pcast",
    "random_seed", "random_wrap", "random_unwrap", "random_fold_in", "sharding_constraint",
    "mesh_cast", "reshard", "empty",
})
# Identity-like or host-side: no kernel at all.
FREE = frozenset({"name", "optimization_barrier", "debug_callback", "debug_print",
                  "checkpoint_name"})

FLOP_RULES = {
    "dot_general": _dot_general,
    "conv_general_dilated": _conv,
    "reduce_window_sum": _reduce_window, "reduce_window_max": _reduce_window,
    "reduce_window_min": _reduce_window, "reduce_window": _reduce_window,
    "select_and_scatter_add": PER_INPUT, "scatter-add": _scatter, "scatter_add": _scatter,
    "scatter": ZERO, "scatter_mul": _scatter, "scatter_min": _scatter, "scatter_max": _scatter,
    "cumsum": PER_INPUT, "cumprod": PER_INPUT, "cummax": PER_INPUT, "cummin": PER_INPUT,
    "cumlogsumexp": PER_INPUT, "sort": _sort, "top_k": PER_INPUT,
    "psum": PER_INPUT, "pmax": PER_INPUT, "pmin": PER_INPUT, "psum_scatter": PER_INPUT,
    "reduce_scatter": PER_INPUT, "psum_invariant": PER_INPUT,
    "random_bits": PER_OUTPUT, "threefry2x32": PER_OUTPUT, "rng_bit_generator": PER_OUTPUT,
    "rng_uniform": PER_OUTPUT,
}
for _p in ELEMENTWISE:
    FLOP_RULES.setdefault(_p, PER_OUTPUT)
for _p in REDUCTIONS:
    FLOP_RULES.setdefault(_p, PER_INPUT)
for _p in MOVEMENT | FREE | {"convert_element_type", "copy", "copy_p", "stop_gradient"}:
    FLOP_RULES[_p] = ZERO

# Primitives with bodies: FLOPs come from the body (× trip count for scan).
CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "custom_jvp_call",
                   "custom_vjp_call", "remat2", "checkpoint", "custom_lin", "shard_map", "xla_pmap"})
CONTROL = frozenset({"cond", "scan", "while"})


def known(prim: str) -> bool:
    return prim in FLOP_RULES or prim in CALLS or prim in CONTROL


def body_jaxprs(eqn):
    """The jaxprs a call/control-flow equation runs (for recursion)."""
    out = []
    for val in eqn.params.values():
        for item in (val if isinstance(val, (tuple, list)) else (val,)):
            if isinstance(item, ClosedJaxpr):
                out.append(item.jaxpr)
            elif hasattr(item, "eqns") and hasattr(item, "invars"):
                out.append(item)
    return out
