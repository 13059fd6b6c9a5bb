"""The one table of primitive classes: what each JAX primitive is to the op view (lecture §2.1,
§8.1 demo 2), the roofline cost model (§4.2), the passes (§4.1, §8.1) and the evaluators.

Names are JAX's primitive names (``eqn.primitive.name``). A primitive in no class is *unknown*: the
cost model reports it instead of counting it as zero, and the passes treat it as opaque (never
folded, merged or evaluated early).
"""
from __future__ import annotations

# ---- primitives without bodies ----------------------------------------------------------------

# Elementwise math: each output element from the same-index input elements. One FLOP per output
# element; the fusion model merges runs of them; the op view gives them their broadcasts.
ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "rem", "pow", "integer_pow", "max", "min", "neg",
    "abs", "sign", "floor", "ceil", "round", "exp", "exp2", "log", "log1p", "expm1", "tanh",
    "logistic", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh",
    "acosh", "atanh", "sqrt", "rsqrt", "cbrt", "erf", "erfc", "erf_inv", "lgamma", "digamma",
    "square", "reciprocal", "is_finite", "select_n", "clamp", "convert_element_type",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "nextafter", "copy",
    "copy_p", "stop_gradient", "imag", "real", "conj", "shift_left", "shift_right_logical",
    "shift_right_arithmetic", "population_count",
})

# Shape-only views of the same elements. One feeding only an elementwise op belongs to that op in
# the op view: broadcasting is free in every eager framework, so ``x @ W + b`` is two ops.
SHAPE_ONLY = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})

# Reductions: one output element from many inputs; one FLOP per input element.
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and",
                        "reduce_or", "argmax", "argmin", "reduce_precision"})

# Contractions (matmul, convolution): the kernels the fusion model never merges with neighbours,
# and the ones the graph rewrites of §4.1 match.
CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated"})

# Scans and sorts along an axis that the passes know to be pure and deterministic (the cost model
# has FLOP rules for more: cumlogsumexp and top_k stay opaque to the passes).
SCANS_AND_SORTS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "sort", "argsort"})

# Data movement on one device (copies, slices, layout and dtype changes): bytes, no arithmetic.
LOCAL_MOVEMENT = frozenset({
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice", "dynamic_slice",
    "dynamic_update_slice", "concatenate", "pad", "gather", "rev", "iota", "select_and_gather_add",
    "convert_element_type", "bitcast_convert_type", "copy", "copy_p", "stop_gradient", "split",
    "real", "imag", "reduce_precision", "squeeze_p", "full_like",
})

# Data movement between devices inside shard_map (§6): bytes, no arithmetic, and device-dependent,
# so never folded or merged.
COLLECTIVE_MOVES = frozenset({"all_gather", "all_to_all", "ppermute", "axis_index", "pbroadcast",
                              "pvary", "pcast"})

# Reductions across devices: one add per input element.
COLLECTIVE_REDUCTIONS = frozenset({"psum", "pmax", "pmin", "psum_scatter", "reduce_scatter",
                                   "psum_invariant"})

# Placement and sharding annotations: they move or label data and are never computed ahead of time.
PLACEMENT = frozenset({"device_put", "sharding_constraint", "mesh_cast", "reshard", "empty"})

# Random numbers. Key plumbing moves bits (no arithmetic); generators cost one op per output
# element. Random state is never folded or merged.
RNG_KEYS = frozenset({"random_seed", "random_wrap", "random_unwrap", "random_fold_in",
                      "random_split", "random_clone"})
RNG_BITS = frozenset({"random_bits", "threefry2x32", "threefry4x32", "rng_bit_generator",
                      "rng_uniform", "random_gamma"})

# Everything that moves bytes without arithmetic: zero FLOPs in the cost model.
MOVEMENT = LOCAL_MOVEMENT | COLLECTIVE_MOVES | PLACEMENT | RNG_KEYS

# Identity-like or host-side: no kernel at all (no FLOPs, no bytes, not an op of a kernel).
FREE = frozenset({"name", "optimization_barrier", "debug_callback", "debug_print",
                  "checkpoint_name"})

# Known pure and deterministic: safe to fold, merge (CSE) and evaluate early. Anything else (user
# primitives, random state, collectives, placement, callbacks) is opaque to the passes.
PURE = ELEMENTWISE | REDUCTIONS | CONTRACTIONS | SHAPE_ONLY | LOCAL_MOVEMENT | SCANS_AND_SORTS

# Array operations whose params never hold a jaxpr (the body walk skips them without a look).
ARRAY_OPS = PURE

# ---- primitives with bodies (``ir.walk.bodies`` finds the bodies) -----------------------------

# jax.jit's call primitive (``pjit`` in older JAX releases).
JIT = frozenset({"jit", "pjit"})

# A body and nothing else: inlining one changes nothing (the ``inline`` pass).
PLAIN_CALLS = JIT | {"closed_call", "core_call"}

# A body plus a user's derivative rule: inlining one would drop the rule and change gradients
# (relu's at 0), so these stay calls.
CUSTOM_DERIVATIVE_CALLS = frozenset({"custom_jvp_call", "custom_vjp_call"})

# Calls a user named (``jit[name=softmax_xent]``, ``custom_jvp_call`` of relu): one op of the op
# view; pure exactly when their body is.
NAMED_CALLS = PLAIN_CALLS | CUSTOM_DERIVATIVE_CALLS

# jax.checkpoint: a body with a recomputation policy (§5).
REMAT_CALLS = frozenset({"remat2", "checkpoint"})

# Calls whose outputs are their single body's outputs on their inputs: an evaluator may run the
# body in place (custom_lin is linearize's stand-in for a custom rule).
TRANSPARENT_CALLS = NAMED_CALLS | REMAT_CALLS | {"custom_lin"}

# A body run once per device (§6).
MAPPED_CALLS = frozenset({"shard_map", "xla_pmap"})

# Every call: FLOPs come from the body.
CALLS = TRANSPARENT_CALLS | MAPPED_CALLS

# Control flow: a body run a data-dependent number of times (cond: one branch, scan: ``length``
# trips, while: unknown).
CONTROL = frozenset({"cond", "scan", "while"})
