"""Rule: fold an inference BatchNorm (any per-channel affine map) into the conv before it (§4.1 rule 1).

Anchor: a conv site (``linear.convs``) whose output feeds per-channel affine ops (``affine``):
``s ⊙ conv(x, W) + t`` with constant s, t, however BatchNorm is written (the named ``batch_norm``
call, flax's and equinox's inline forms, through reshapes, squeezes, transposes and broadcasts).
Emit: one named op ``conv_bias(x, W·s, (B − μ)·s + β)`` (W scaled along the kernel's output-feature
axis), the movement views replayed after it. A bias add alone is reported as a bias merge.
Refused with the reason: training-mode BN (statistics from the batch), integer division (not
linear), a constant that is not per-channel, an output other ops read too, a non-finite folded
scale (var + eps ≤ 0), narrow integer weights that cannot hold the scaled values.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Tracer
from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rules.affine import Chain, affine_chain
from mlsys_jax.passes.rules.linear import CONV, LinearSite, conv_bias_body, convs, emit_conv, \
    scale_weights, weights_overflow
from mlsys_jax.passes.rules.rule import Check, Match, Refused, Rule


@dataclass(frozen=True, kw_only=True)
class ConvFold(Match):
    site: LinearSite
    chain: Chain


def match(level):
    if level.nested and conv_bias_body(level.jaxpr) is not None:
        return  # inside a conv_bias op: already folded, its bias is the call's argument
    for site in convs(level.jaxpr):
        chain = affine_chain(level, site)
        if chain.refusal:
            yield Refused(site.index, *chain.refusal)
        if chain.end is None:
            continue
        end = level.eqns[chain.end].outvars[0]
        yield ConvFold(anchor=chain.end, eqns=(site.index, *chain.eqns), outputs=(end,),
                       detail=f"{chain.aff.describe()} into conv at {level.where(site.index)}",
                       site=site, chain=chain)


def finite_map(m: ConvFold, level):
    aff = m.chain.aff
    if not (np.isfinite(aff.a).all() and np.isfinite(aff.b).all()):
        return "the folded scale or shift is not finite (BatchNorm var + eps ≤ 0?); left as it was"
    return None


def weights_fit(m: ConvFold, level):
    return weights_overflow(level, m.site, m.chain.aff.a)


def integer_weights_hold(m: ConvFold, level):
    wdt, zdt = np.dtype(m.site.w.aval.dtype), np.dtype(m.site.out.aval.dtype)
    if "scale" in m.chain.aff.ops and zdt.kind in "iu" and wdt != zdt:
        return (f"{wdt} weights of a conv into {zdt} cannot hold the scaled weights exactly "
                "(integer products wrap at the weights' width); left as it was")
    return None


def emit(m: ConvFold, em):
    # §4.1: W·s and B' = (B − μ)·s + β depend only on constants: computed here, once.
    site, aff = m.site, m.chain.aff
    new_w = scale_weights(em.value(site.w), aff.a, site, em.dtype(site.w))
    dtype = em.dtype(site.out)
    b0 = None if site.b is None else em.value(site.b)
    if b0 is None:
        with np.errstate(over="ignore"):  # an Inf is judged by translation validation
            new_b = aff.b.astype(dtype)
    elif not isinstance(b0, Tracer):
        with np.errstate(over="ignore", invalid="ignore"):
            new_b = (np.asarray(b0).astype(aff.b.dtype) * aff.a + aff.b).astype(dtype)
    else:
        new_b = b0 * jnp.asarray(aff.a.astype(dtype)) + jnp.asarray(aff.b.astype(dtype))
    out = emit_conv(em, site, em.value(site.x), new_w, new_b)
    for move in m.chain.moves:  # the reshapes/squeezes that stood between conv and BN
        out = em.bind(move, [out])[0]
    return {m.outputs[0]: out}


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold inference BatchNorm into the conv's weights and a bias (§4.1)",
    match=match, emit=emit,
    checks=(Check("finite_map", finite_map), Check("integer_weights_hold", integer_weights_hold),
            Check("weights_fit_dtype", weights_fit)),
    primitives=frozenset({CONV}))


def fold_conv_bn(only: int | None = None) -> Pass:
    """Fold inference-mode BatchNorm — any per-output-channel ``s * conv(x, W) + t`` with constant
    s, t — into the conv's weights and a bias: one named op ``conv_bias`` (§4.1 rule 1). See the
    module doc for what it recognises and refuses."""
    return RULE.make_pass(only)
