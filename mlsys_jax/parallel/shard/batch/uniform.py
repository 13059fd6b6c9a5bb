"""Along which dimensions a batch-independent value varies (``Free.varying``).

A free value that varies along the dimension where another value holds the examples is *position
mixing*: each example meets something that depends on where it sits in the batch (a dropout mask
from a fixed key). The dimensions must therefore not be over-approximated where a value is in
fact uniform: an RNN's zero initial state times the recurrent kernel is uniform along the batch
(``h @ W`` varies only along W's columns), and a causal mask built from ``iota`` comparisons on the
time axes is uniform along the batch it is broadcast to. Each rule maps the inputs' varying
dimensions to the output's; a primitive without one varies along every dimension it has.
"""
from __future__ import annotations

from mlsys_jax.parallel.shard.matmul_dims import out_dim


def _shape(v) -> tuple:
    return tuple(getattr(v.aval, "shape", ()))


def all_dims(v) -> frozenset:
    return frozenset(d for d, s in enumerate(_shape(v)) if s > 1)


def _keep(v, dims) -> frozenset:
    """``dims`` of ``v`` that have more than one element."""
    shape = _shape(v)
    return frozenset(d for d in dims if 0 <= d < len(shape) and shape[d] > 1)


def _dot(eqn, ins: list) -> frozenset:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    out = {k for k, (a, b) in enumerate(zip(lb, rb)) if a in ins[0].varying or b in ins[1].varying}
    for side, contract, batch in ((0, lc, lb), (1, rc, rb)):
        out |= {out_dim(eqn, side, d) for d in ins[side].varying
                if d not in contract and d not in batch}
    return frozenset(out)


def _reshape(eqn, ins: list) -> frozenset:
    """Dimensions are grouped into blocks whose sizes multiply alike on both sides; an output
    dimension varies when its block holds a varying input dimension."""
    src, dst = _shape(eqn.invars[0]), _shape(eqn.outvars[0])
    out, i, j = set(), 0, 0
    while i < len(src) or j < len(dst):
        bi, bj = [i] if i < len(src) else [], [j] if j < len(dst) else []
        a = src[i] if i < len(src) else 1
        b = dst[j] if j < len(dst) else 1
        i, j = i + 1, j + 1
        while a != b and (i < len(src) or j < len(dst)):
            if (a < b and i < len(src)) or j >= len(dst):
                a, bi = a * src[i], bi + [i]
                i += 1
            else:
                b, bj = b * dst[j], bj + [j]
                j += 1
        if any(d in ins[0].varying for d in bi):
            out |= set(bj)
    return frozenset(out)


def _reduce(eqn, ins: list) -> frozenset:
    axes = tuple(eqn.params["axes"])
    return frozenset(d - sum(a < d for a in axes) for d in ins[0].varying if d not in axes)


def _squeeze(eqn, ins: list) -> frozenset:
    dims = eqn.params["dimensions"]
    return frozenset(d - sum(a < d for a in dims) for d in ins[0].varying if d not in dims)


def _cumulative(eqn, ins: list) -> frozenset:
    return ins[0].varying | {eqn.params["axis"]}


def _concatenate(eqn, ins: list) -> frozenset:
    return frozenset().union(*(s.varying for s in ins)) | {eqn.params["dimension"]}


def _same(eqn, ins: list) -> frozenset:
    return ins[0].varying


def _pad(eqn, ins: list) -> frozenset:
    return ins[0].varying | {d for d, c in enumerate(eqn.params["padding_config"])
                             if tuple(c) != (0, 0, 0)}


RULES = {"dot_general": _dot, "reshape": _reshape, "squeeze": _squeeze,
         "reduce_sum": _reduce, "reduce_max": _reduce, "reduce_min": _reduce,
         "reduce_prod": _reduce, "reduce_and": _reduce, "reduce_or": _reduce,
         "argmax": _reduce, "argmin": _reduce,
         "cumsum": _cumulative, "cumprod": _cumulative, "cummax": _cumulative,
         "cummin": _cumulative, "cumlogsumexp": _cumulative,
         "concatenate": _concatenate, "rev": _same, "slice": _same, "pad": _pad,
         "convert_element_type": _same, "copy": _same, "copy_p": _same}


def varying(eqn, ins: list, v) -> frozenset | None:
    """The dimensions along which output ``v`` varies, or None where no rule applies."""
    rule = RULES.get(eqn.primitive.name)
    if rule is None or len(eqn.outvars) != 1:
        return None
    return _keep(v, rule(eqn, ins))
