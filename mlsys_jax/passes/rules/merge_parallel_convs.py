"""Rule: merge convs on the same input into one (§4.1 rule 2; TASO's merge of parallel convs).

Anchor: two conv sites on one input. Summed (``conv(x, W₁) + conv(x, W₂)``): one conv with summed
weights and biases, the add gone. Used apart (with ``concat``): one conv with the output channels
concatenated, then two slices. Both need identical window, strides, padding, dilation, groups,
precision, layout and dtypes; a refusal names the attribute that differs, or the nonlinear op
standing between a conv and the add. The summed merge is exact on finite inputs only, like rule 2
itself: where an input is ±Inf, conv(x, W₁) + conv(x, W₂) is Inf − Inf = NaN wherever the weights
differ in sign, conv(x, W₁ + W₂) is ±Inf.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import Tracer, Var
from mlsys_jax.ir.opview import op_name
from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rewrite.mutate import RuleMutant, during, proxy
from mlsys_jax.passes.rewrite.linear import CONV, LinearSite, conv_difference, convs, emit_conv, \
    fmt_window
from mlsys_jax.passes.rewrite.rule import FINITE_ONLY, Match, Refused, Rule


@dataclass(frozen=True, kw_only=True)
class ConvPair(Match):
    a: LinearSite
    b: LinearSite
    summed: bool


def _np(x):
    return x if x is None or isinstance(x, Tracer) else np.asarray(x)


def match(level, concat: bool = True):
    sites = convs(level.jaxpr)
    by_out = {s.out: s for s in sites}
    used, reported = set(), set()
    for i, e in enumerate(level.eqns):  # §4.1 rule (2): Conv(X,W1) + Conv(X,W2) = Conv(X,W1+W2)
        if e.primitive.name not in ("add", "add_any") or len(e.invars) != 2:
            continue
        a, b = (by_out.get(v) if isinstance(v, Var) else None for v in e.invars)
        if a is None or b is None:
            if by_out:
                yield from _explain_nonlinear(level, e, i, by_out)
            continue
        if a is b or a.x is not b.x or a.index in used or b.index in used:
            continue
        diff = conv_difference(a, b)
        if diff is None and a.out.aval != b.out.aval:
            diff = f"output types differ: {a.out.aval.str_short()} vs {b.out.aval.str_short()}"
        if diff is None and not (level.single_use(a.out, i) and level.single_use(b.out, i)):
            diff = "a conv output is also used elsewhere"
        if diff is not None:
            reported.add(frozenset((a.index, b.index)))
            yield Refused(i, "same_attributes", f"cannot merge convs {a.index} and {b.index}: {diff}")
            continue
        used |= {a.index, b.index}
        yield ConvPair(anchor=i, eqns=(a.index, b.index, i), outputs=(e.outvars[0],),
                       detail=f"merged convs {level.where(a.index)} + {level.where(b.index)} "
                              f"({fmt_window(a)}); the add disappears (exact for finite inputs)",
                       a=a, b=b, summed=True)
    if concat:
        yield from _concatenated(level, sites, used, reported)


def _explain_nonlinear(level, add, i, by_out):
    """Refuse rule (2) loudly when a nonlinear op sits between parallel convs and their add."""
    found = []
    for v in add.invars:
        site = by_out.get(v) if isinstance(v, Var) else None
        op = None
        if site is None and isinstance(v, Var) and v in level.producer:
            e = level.producer[v]
            ins = [x for x in e.invars if isinstance(x, Var)]
            if len(ins) == 1 and ins[0] in by_out:
                site, op = by_out[ins[0]], op_name(e)
        found.append((site, op))
    (sa, oa), (sb, ob) = found
    if sa is not None and sb is not None and sa.x is sb.x and (oa or ob):
        yield Refused(i, "linear_between", f"cannot merge convs {sa.index} and {sb.index}: a "
                      f"nonlinear op ({oa or ob}) sits between a conv and the add; rule (2) needs "
                      "the conv outputs summed directly")


def _concatenated(level, sites, used, reported):
    """Independently used convs on one input: one conv with concatenated output channels, then
    slices. A pair that cannot merge is refused with the reason, once (``reported``: refused
    already as a summed pair)."""
    free = [s for s in sites if s.index not in used]
    for n, a in enumerate(free):
        for b in free[n + 1:]:
            if a.index in used or b.index in used or a.x is not b.x:
                continue
            diff = conv_difference(a, b)
            if diff is None and (a.params["feature_group_count"] != 1
                                 or a.params["batch_group_count"] != 1):
                # with groups, output channels belong to input groups: no plain concat
                diff = "grouped convs cannot be concatenated (channels belong to input groups)"
            if diff is not None:
                if frozenset((a.index, b.index)) not in reported:
                    yield Refused(a.index, "same_attributes", f"cannot merge convs {a.index} and "
                                  f"{b.index} (outputs used apart): {diff}")
                continue
            used |= {a.index, b.index}
            yield ConvPair(anchor=a.index, eqns=(a.index, b.index), outputs=(a.out, b.out),
                           detail=f"merged convs {level.where(a.index)} ∥ {level.where(b.index)} "
                                  "by concatenating output channels", a=a, b=b, summed=False)


def emit(m: ConvPair, em):
    a, b = m.a, m.b
    ws = [_np(em.value(s.w)) for s in (a, b)]
    bs = [None if s.b is None else _np(em.value(s.b)) for s in (a, b)]
    x = em.value(a.x)
    if m.summed:
        bias = bs[0] if bs[1] is None else (bs[1] if bs[0] is None else bs[0] + bs[1])
        return {m.outputs[0]: emit_conv(em, a, x, ws[0] + ws[1], bias)}
    xp = np if not any(isinstance(v, Tracer) for v in ws + bs) else jnp
    w = xp.concatenate(ws, axis=a.dims.rhs_spec[0])
    bias = None
    if any(v is not None for v in bs):
        bias = xp.concatenate([v if v is not None else np.zeros((s.out_features,), em.dtype(s.out))
                               for v, s in zip(bs, (a, b))])
    z = emit_conv(em, a, x, w, bias)
    fd, oa = a.feature_dim, a.out_features
    return {a.out: lax.slice_in_dim(z, 0, oa, axis=fd),
            b.out: lax.slice_in_dim(z, oa, z.shape[fd], axis=fd)}


# ---- the fuzzer's side: a motif that makes the rule fire, and its mutants ----------


def motif(g):
    """Two convs on one input: mergeable (summed or used apart) or a near-miss that differs in
    one attribute (kernel size: enlarge first; others: merge must refuse)."""
    c, v = g.c, g.pick_main()
    cin = g.shapes[v][g.chan_axis()]
    variant = c.choice(g.CONV_PAIRS)
    base = dict(out=cin, k=3, stride=1, pad="SAME", dil=1, groups=1, precision=None)
    other = {**base, **g.NEAR_MISSES.get(variant, {})}
    a = g.conv(v, **base)
    b = g.conv(v, **other)
    if g.shapes[a] == g.shapes[b] and variant != "none_indep":
        g.combine(a, b) if c.chance(0.3) else g.add({"op": "binary", "fn": "add", "args": [a, b]})
    else:
        g.forced += [a, b]


def merge_concatenating_wrong_axis():
    """merge_parallel_convs concatenating the weights on the axis after the output-feature one."""
    from mlsys_jax.passes.rules import merge_parallel_convs as rule

    def wrong(concatenate):
        def f(arrays, axis=0, **kw):
            nd = np.ndim(arrays[0])
            return concatenate(arrays, axis=(axis + 1) % nd if nd > 1 else axis, **kw)
        return f
    return during(rule.merge_parallel_convs(), (rule, "np", proxy(rule.np, concatenate=wrong)),
                   (rule, "jnp", proxy(rule.jnp, concatenate=wrong)))


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="merge convs on the same input into one (§4.1)",
    match=match, emit=emit,
    caveat=f"{FINITE_ONLY}: summed weights turn Inf·w₁ + Inf·w₂ (NaN where w₁, w₂ "
           "differ in sign) into Inf·(w₁ + w₂)",
    primitives=frozenset({CONV}), motif=motif, motif_weight=2, order=2, mutants=(
        RuleMutant("merge_concat_wrong_axis", merge_concatenating_wrong_axis,
                   "parallel convs concatenated on the wrong weight axis"),))


def merge_parallel_convs(concat: bool = True, only: int | None = None) -> Pass:
    """Merge convs on the same input with identical window, strides, padding, dilation, groups,
    precision and dtypes: summed outputs → one conv with summed weights (§4.1 rule 2); with
    ``concat``, independently used outputs → one conv with concatenated channels plus slices. A
    refusal names the attribute that differs. The summed merge is exact on finite inputs only
    (see the module doc)."""
    return RULE.make_pass(only, concat=concat)
