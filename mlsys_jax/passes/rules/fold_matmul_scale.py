"""Rule: fold a constant scale into the matmul whose weights are constants — attention's query
projection scaled by 1/√d, before or after the ``q·kᵀ`` matmul.

Anchor, two forms, both for a ``dot_general`` with constant weights (``linear.dots``: the query
projection ``q = x @ Wq (+ bq)``):

- the projection followed by a scale (after at most its bias): ``q / √d``, as flax's
  ``dot_product_attention`` writes it; the per-feature chain comes from ``affine``;
- the projection, through movement views (heads split, transposed), is one operand of a second
  ``dot_general`` (the scores ``q·kᵀ``) whose output, read once, is scaled by a constant *scalar*
  ``c``: ``softmax((q @ k.T) * c)``. A matmul is linear in each operand, so
  ``(q·kᵀ)·c = (q·c)·kᵀ`` for a scalar ``c`` whatever the axes.

Emit: the projection on ``Wq·c`` with bias ``bq·c`` (``fold``), then the views and the scores
matmul as they were; the scale is gone. A BatchNorm-shaped chain (a shift after the scale) is
``fold_dense_bn``'s. Refused with the reason: a scores scale that is not one scalar (it would
scale q's features unevenly), a truncating integer division, a value read elsewhere too, and the
checks of ``fold`` (a non-finite scale, narrow integer weights, weights that overflow their dtype).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rewrite import fold
from mlsys_jax.passes.rewrite.affine import affine_chain
from mlsys_jax.passes.rewrite.axes import MOVES
from mlsys_jax.passes.rules.fold_dense_bn import batch_norm_shaped
from mlsys_jax.passes.rewrite.linear import DOT, dots
from mlsys_jax.passes.rewrite.mutate import RuleMutant, during
from mlsys_jax.passes.rewrite.rule import Refused, Rule


@dataclass(frozen=True, kw_only=True)
class ScoresFold(fold.Fold):
    """A scalar scale of the scores folded into the projection: ``views`` are the movement
    equations from the projection to the scores matmul ``scores``, ``q`` the operand it reads."""

    views: tuple
    scores: object
    q: object
    projected: object  # the projection's output (the chain's end, or the site's own output)


def _scalar(level, v):
    """The value of ``v`` when it is one scalar (every element equal), else None."""
    val = level.value(v) if type(v) is not Literal else np.asarray(v.val)
    if val is None:
        return None
    arr = np.asarray(val)
    if arr.size == 0 or not np.all(arr == arr.reshape(-1)[0]):
        return None
    return arr.reshape(-1)[0]


def _scores_scale(level, site, chain):
    """The ScoresFold after ``site`` and its (scale-free) chain, a Refused, or None."""
    end = site.out if chain.end is None else level.eqns[chain.end].outvars[0]
    t, views = end, []
    while True:
        us = level.users.get(t, [])
        if len(us) != 1 or us[0] < 0:
            return None
        e = level.eqns[us[0]]
        if e.primitive.name not in MOVES:
            break
        views.append(us[0])
        t = e.outvars[0]
    if e.primitive.name != DOT or level.value(e.invars[1 - list(e.invars).index(t)]) is not None:
        return None
    k = us[0]
    outs = level.users.get(e.outvars[0], [])
    if len(outs) != 1 or outs[0] < 0:
        return None
    s = level.eqns[outs[0]]
    scores = e.outvars[0]
    if s.primitive.name not in ("mul", "div") or sum(x is scores for x in s.invars) != 1 \
            or (s.primitive.name == "div" and s.invars[0] is not scores) \
            or s.outvars[0].aval.shape != scores.aval.shape:
        return None  # not a scale of the scores (a constant divided by them is not linear)
    (other,) = [x for x in s.invars if x is not scores]
    if type(other) is not Literal and level.value(other) is None:
        return None  # scaled by a traced value: not a constant scale
    c = _scalar(level, other)
    if c is None:
        return Refused(outs[0], "scalar_scale", "the scores are scaled by a constant that is not "
                       "one scalar: folding it into the query projection would scale its features "
                       "unevenly")
    if s.primitive.name == "div":
        if np.dtype(s.outvars[0].aval.dtype).kind in "iu":
            return Refused(outs[0], "linear_over_integers", "integer division truncates: the "
                           "scores' division is not linear, so it does not fold")
        c = 1.0 / np.float64(c)
    aff = chain.aff
    vdt = aff.a.dtype
    scaled = aff.then(aff.a * np.asarray(c).astype(vdt), aff.b * np.asarray(c).astype(vdt), "mul")
    folded = replace(chain, aff=scaled)
    return ScoresFold(anchor=outs[0], eqns=(site.index, *chain.eqns, *views, k, outs[0]),
                      outputs=(s.outvars[0],), site=site, chain=folded, views=tuple(views),
                      scores=e, q=t, projected=end,
                      detail=f"folded the scores' scale into the query projection at "
                             f"{level.where(site.index)}")


def match(level):
    scores = {}  # one fold per scaled scores matmul: into its lhs (the query) where both qualify
    for site in dots(level.jaxpr, level.known):
        chain = affine_chain(level, site)
        ops = chain.aff.ops
        if chain.end is not None and "scale" in ops:
            if not batch_norm_shaped(ops):  # (a BatchNorm's shape, and its refusals: fold_dense_bn)
                if chain.refusal:
                    yield Refused(site.index, *chain.refusal)
                yield fold.fold_match(level, site, chain, f"folded a scale ({len(ops)} ops) into "
                                      f"the projection at {level.where(site.index)}")
            continue
        found = _scores_scale(level, site, chain)
        if isinstance(found, Refused):
            yield found
        elif found is not None and (found.anchor not in scores
                                    or found.q is found.scores.invars[0]):
            scores[found.anchor] = found
    yield from scores.values()


def emit(m, em):
    if not isinstance(m, ScoresFold):
        return fold.emit(m, em)
    (q,) = fold.emit(replace(m, outputs=(m.projected,)), em).values()
    for i in m.views:
        q = em.bind(em.level.eqns[i], [q])[0]
    args = [q if v is m.q else em.value(v) for v in m.scores.invars]
    return {m.outputs[0]: em.bind(m.scores, args)[0]}


# ---- the fuzzer's side: a motif that makes the rule fire, and its mutants ----------

ATTENTION_FORMS = ("q_scaled", "scores_scaled", "scores_div")  # the fuzzer's attention node


def motif(g):
    """Scaled dot-product attention scores: ``q / √d`` before ``q·kᵀ``, or the scores scaled."""
    v = g.pick(lambda s: s == g.shapes[0])
    g.add({"op": "attention", "form": g.c.choice(ATTENTION_FORMS), "seed": g.c.seed(),
           "args": [v]}, g.shapes[0])


def matmul_scale_squared():
    """fold_matmul_scale folding the square of the scale into the weights."""
    real = fold.scale_weights
    return during(fold_matmul_scale(), (fold, "scale_weights",
                                        lambda w, vec, site, dtype: real(w, vec * vec, site, dtype)))


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold a constant scale (attention's 1/√d) into a matmul's constant weights",
    match=match, emit=emit, checks=fold.CHECKS, primitives=frozenset({DOT}),
    # drawn at the start of dense programs and among the users' motifs (fuzz/spec.py)
    motif=motif, motif_layouts=("dense",), motif_weight=0, order=5, mutants=(
        RuleMutant("matmul_scale_squared", matmul_scale_squared,
                   "the scale folded in twice (its square)"),))


def fold_matmul_scale(only: int | None = None) -> Pass:
    """Fold a constant scale into the matmul with constant weights before it — ``q / √d`` or
    ``(q @ k.T) * c`` into the query projection. See the module doc."""
    return RULE.make_pass(only)
