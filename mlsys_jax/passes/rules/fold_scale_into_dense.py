"""Rule: fold a constant per-feature scale *before* a Dense layer into its weights' rows.

Anchor: ``x = n · γ`` read only by a ``dot_general`` with constant weights ``W`` that contracts
the axes along which γ varies — an RMSNorm's or LayerNorm's scale (``norm(h) * scale``, as Llama,
T5 and Gemma write RMSNorm) feeding the next projection. Since the dot sums over those axes,
``(n · γ) @ W = n @ (γ ⊙ W)`` with γ along W's contracted rows: the multiply is gone and the scale
lives in the weights. γ is proved per feature from its *values* (a constant equal along every
axis the dot does not contract), never guessed from its shape. Refused with the reason: a scale
that varies along a kept axis, a non-finite scale, a batched dot, an integer program, a scaled
value read elsewhere too (its multiply cannot go).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal, Tracer, Var
from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rewrite.linear import DOT, LinearSite, dots, emit_dot
from mlsys_jax.passes.rewrite.mutate import RuleMutant, during
from mlsys_jax.passes.rewrite.rule import Match, Precondition, Refused, Rule


@dataclass(frozen=True, kw_only=True)
class ScaledInput(Match):
    site: LinearSite
    n: object            # the unscaled input
    vec: np.ndarray      # γ along the contracted axes, in the dot's dimension-number order
    w_axes: tuple        # W's contracted axes, in the same order


def _contracted(site: LinearSite) -> tuple[tuple, tuple]:
    """(x's contracted axes, W's contracted axes), paired in dimension-number order."""
    (lhs, rhs), _ = site.params["dimension_numbers"]
    return (tuple(rhs), tuple(lhs)) if site.op.invars[0] is site.w else (tuple(lhs), tuple(rhs))


def per_feature(c: np.ndarray, shape: tuple, axes: tuple) -> np.ndarray | None:
    """γ along ``axes`` (in that order) if the constant ``c``, broadcast to ``shape``, is equal
    along every other axis; else None."""
    full = np.broadcast_to(c, shape)
    moved = np.moveaxis(full, axes, range(len(axes)))
    vec = moved[(slice(None),) * len(axes) + (0,) * (len(shape) - len(axes))]
    expand = vec.reshape(vec.shape + (1,) * (len(shape) - len(axes)))
    return np.array(vec) if np.array_equal(moved, np.broadcast_to(expand, moved.shape)) else None


def match(level):
    for site in dots(level.jaxpr, level.known):
        x = site.x
        mul = level.producer.get(x) if isinstance(x, Var) else None
        if mul is None or mul.primitive.name != "mul":
            continue
        known = [v for v in mul.invars if level.value(v) is not None or isinstance(v, Literal)]
        if len(known) != 1:
            continue
        n = next(v for v in mul.invars if v is not known[0])
        if site.params["dimension_numbers"][1][0]:
            yield Refused(site.index, "no_batch_axes", "a batched dot_general: the scale would "
                          "have to fold per batch element")
            continue
        if not np.issubdtype(np.dtype(x.aval.dtype), np.floating):
            yield Refused(site.index, "float_program", "an integer scale and weights: folding "
                          "them changes where the products overflow")
            continue
        if not level.single_use(x, site.index):
            yield Refused(site.index, "single_use", "the scaled value is read elsewhere too: its "
                          "multiply cannot go")
            continue
        c = known[0].val if isinstance(known[0], Literal) else level.value(known[0])
        x_axes, w_axes = _contracted(site)
        vec = per_feature(np.asarray(c, np.float64), tuple(x.aval.shape), x_axes)
        if vec is None:
            yield Refused(site.index, "per_feature", "the scale varies along an axis the "
                          "dot_general keeps: it is not one factor per contracted feature")
            continue
        yield ScaledInput(anchor=site.index, eqns=(level.eqns.index(mul), site.index),
                          outputs=(site.out,), site=site, n=n, vec=vec, w_axes=w_axes,
                          detail=f"per-feature scale folded into the rows of the Dense layer "
                                 f"at {level.where(site.index)}")


def _finite(m: ScaledInput, level) -> str | None:
    return None if np.isfinite(m.vec).all() else "the scale is not finite (0·Inf would be NaN)"


def rows_multiplier(vec: np.ndarray, ndim: int, axes: tuple) -> np.ndarray:
    """γ as an array broadcasting along W (``ndim`` axes), its axes on W's contracted ``axes``."""
    return np.moveaxis(vec.reshape(vec.shape + (1,) * (ndim - vec.ndim)), range(vec.ndim), axes)


def emit(m: ScaledInput, em):
    w = em.value(m.site.w)
    mult = rows_multiplier(m.vec, len(w.shape), m.w_axes)
    if isinstance(w, Tracer):
        new_w = w * jnp.asarray(mult.astype(w.dtype))
    else:
        new_w = (np.asarray(w, np.float64) * mult).astype(np.asarray(w).dtype)
    return {m.site.out: emit_dot(em, m.site, em.value(m.n), new_w)}


# ---- the fuzzer's side: a motif that makes the rule fire, and its mutants ----------

def motif(g):
    """A value scaled per feature by a constant vector (an RMSNorm's scale), then a Dense."""
    v = g.pick(lambda s: len(s) == 2)
    width = g.shapes[v][1]
    gamma = g.add({"op": "const", "fn": "affine", "shape": [width], "seed": g.c.seed(),
                   "args": []}, [width])
    y = g.add({"op": "binary", "fn": "mul", "args": [v, gamma]}, g.shapes[v])
    g.add({"op": "matmul", "n": width, "seed": g.c.seed(), "args": [y]})


def scale_along_columns():
    """fold_scale_into_dense scaling W's columns (its output features) instead of its rows."""
    from mlsys_jax.passes.rules import fold_scale_into_dense as rule

    real = rule.rows_multiplier

    def wrong(vec, ndim, axes):
        m = real(vec, ndim, axes)
        return m.T if m.ndim == 2 else m
    return during(fold_scale_into_dense(), (rule, "rows_multiplier", wrong))


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold a per-feature scale before a Dense layer (RMSNorm's) into its weights' rows",
    match=match, emit=emit, checks=(Precondition("finite_scale", _finite),),
    # drawn as often as three plain motifs: dense programs are 40% of a campaign, and the CI tier
    # wants every pass to fire on a tenth of its programs
    primitives=frozenset({DOT}), motif=motif, motif_layouts=("dense",), motif_weight=3, mutants=(
        RuleMutant("scale_into_dense_columns", scale_along_columns,
                   "the scale folded into W's columns instead of its rows"),))


def fold_scale_into_dense(only: int | None = None) -> Pass:
    """Fold a constant per-feature scale before a Dense layer into its weights' rows:
    ``(n · γ) @ W = n @ (γ ⊙ W)``. See the module doc."""
    return RULE.make_pass(only)
