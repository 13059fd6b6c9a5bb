"""Folding an affine chain into the linear site before it: the algebra and the checks the fold
rules share (``fold_conv_bn``, and the Dense-layer rules).

§4.1 rule (1), for any site (``linear.LinearSite``) and any per-feature map the chain composed
(``affine.Affine``: ``a ⊙ z + b``): ``W' = W ⊙ a`` along the weights' feature axes and
``B' = B ⊙ a + b`` (B: a conv_bias call's own bias, else none), both from constants, computed here
once (float64 or int64, rounded to the weights' dtype once). Refused where the folded map is not
finite (BatchNorm var + eps ≤ 0), where integer weights narrower than the output would wrap, or
where the folded weights overflow their dtype (float16 weights × 200 > 65504).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Tracer
from mlsys_jax.passes.rewrite.affine import Chain
from mlsys_jax.passes.rewrite.linear import LinearSite, emit_conv, emit_dot, scale_weights, \
    weights_overflow
from mlsys_jax.passes.rewrite.rule import Match, Precondition


@dataclass(frozen=True, kw_only=True)
class Fold(Match):
    """A chain folded into its site (``chain.moves``: the views replayed after the new site)."""

    site: LinearSite
    chain: Chain


def fold_match(level, site: LinearSite, chain: Chain, detail: str) -> Fold:
    end = level.eqns[chain.end].outvars[0]
    return Fold(anchor=chain.end, eqns=(site.index, *chain.eqns), outputs=(end,),
                detail=detail, site=site, chain=chain)


def finite_map(m: Fold, level):
    aff = m.chain.aff
    if not (np.isfinite(aff.a).all() and np.isfinite(aff.b).all()):
        return "the folded scale or shift is not finite (BatchNorm var + eps ≤ 0?); left as it was"
    return None


def integer_weights_hold(m: Fold, level):
    wdt, zdt = np.dtype(m.site.w.aval.dtype), np.dtype(m.site.out.aval.dtype)
    if "scale" in m.chain.aff.ops and zdt.kind in "iu" and wdt != zdt:
        return (f"{wdt} weights of a {m.site.kind} into {zdt} cannot hold the scaled weights "
                "exactly (integer products wrap at the weights' width); left as it was")
    return None


def weights_fit(m: Fold, level):
    return weights_overflow(level, m.site, m.chain.aff.a)


CHECKS = (Precondition("finite_map", finite_map),
          Precondition("integer_weights_hold", integer_weights_hold),
          Precondition("weights_fit_dtype", weights_fit))


def folded(em, site: LinearSite, aff):
    """(W ⊙ a, B ⊙ a + b) in the dtypes ``em`` computes in (see the module doc); a and b as
    ``em`` reads the site's features (``Emit.features``: on a validation cut, cut alike)."""
    a, b = em.features(aff.a), em.features(aff.b)
    new_w = scale_weights(em.value(site.w, widened=False), a, site, em.dtype(site.w))
    dtype = em.dtype(site.out)
    b0 = None if site.b is None else em.value(site.b)
    with np.errstate(over="ignore", invalid="ignore"):  # an Inf is judged by validation
        if b0 is None:
            return new_w, b.astype(dtype)
        if not isinstance(b0, Tracer):
            return new_w, (np.asarray(b0).astype(b.dtype) * a + b).astype(dtype)
    return new_w, b0 * jnp.asarray(a.astype(dtype)) + jnp.asarray(b.astype(dtype))


def emit(m: Fold, em):
    """The folded site (a conv_bias op, or a Dense layer's ``x @ W' + b'``), the movement views
    that stood between it and the chain replayed after it."""
    site = m.site
    new_w, new_b = em.once("folded", lambda: folded(em, site, m.chain.aff))
    make = emit_conv if site.kind == "conv" else emit_dot
    out = make(em, site, em.value(site.x), new_w, new_b)
    for move in m.chain.moves:
        out = em.bind(move, [out])[0]
    return {m.outputs[0]: out}
