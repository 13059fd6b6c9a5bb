"""Rule: fold an inference BatchNorm (any per-feature affine map with a shift) into the Dense layer
before it — §4.1 rule (1) on ``dot_general``.

Anchor: a ``dot_general`` whose weights are constants (``linear.dots``) feeding per-feature affine
ops (``affine``), as flax ``nn.Dense`` + ``nn.BatchNorm(use_running_average=True)``, haiku
``hk.Linear`` + ``hk.BatchNorm(is_training=False)`` and equinox ``Linear`` + ``BatchNorm``
(inference, vmapped: ``W @ x`` then a transpose) write it. Emit (``fold``): ``x @ (W·s) + b'``
along the features. Only a chain with a BatchNorm's shape: a shift after a scale, or two shifts
(the layer's bias and the mean); a bias alone is already what the emit would be, and a scale
after at most the bias (attention's ``q / √d``) is ``fold_matmul_scale``'s. Refused with the
reason: training-mode BN (batch statistics), a bias or scale along the rows, a value read
elsewhere too, and the checks of ``fold``.
"""
from __future__ import annotations

from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rewrite import fold
from mlsys_jax.passes.rewrite.affine import affine_chain
from mlsys_jax.passes.rewrite.linear import DOT, dots
from mlsys_jax.passes.rewrite.mutate import RuleMutant, during
from mlsys_jax.passes.rewrite.rule import Refused, Rule


def batch_norm_shaped(ops: tuple) -> bool:
    """A shift after a scale, or two shifts: what a BatchNorm (or a bias and one) folds into."""
    return ("scale" in ops and "shift" in ops[ops.index("scale"):]) or ops.count("shift") >= 2


def match(level):
    for site in dots(level.jaxpr, level.known):
        chain = affine_chain(level, site)
        if chain.refusal:
            yield Refused(site.index, *chain.refusal)
        if chain.end is not None and batch_norm_shaped(chain.aff.ops):
            what = chain.aff.describe().replace("per-channel", "per-feature")
            yield fold.fold_match(level, site, chain,
                                  f"{what} into the Dense layer at {level.where(site.index)}")


# ---- the fuzzer's side: a motif that makes the rule fire, and its mutants ----------

def motif(g):
    """A Dense layer (bias along the features, none, or along the rows: with 4 outputs the rows
    have the features' length), then a BatchNorm or per-feature affine, maybe a relu."""
    v = g.pick(lambda s: len(s) == 2)
    rows = g.shapes[v][0]
    n = g.c.choice((g.shapes[v][1], rows))
    y = g.add({"op": "dense", "n": n, "bias_axis": g.c.choice((1, 1, None, 0)),
               "seed": g.c.seed(), "args": [v]}, [rows, n])
    if g.c.chance(0.8):
        y = g.bn(y)
    if g.c.chance(0.4):
        g.unary(y, "relu")


def dense_bn_scaling_rows():
    """fold_dense_bn scaling W's rows (its input features) instead of its columns."""
    real = fold.scale_weights

    def wrong(w, vec, site, dtype):
        square = len(w.shape) == 2 and w.shape[0] == w.shape[1]
        return real(w.T, vec, site, dtype).T if square else real(w, vec, site, dtype)
    return during(fold_dense_bn(), (fold, "scale_weights", wrong))


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold inference BatchNorm into a Dense layer's weights and bias",
    match=match, emit=fold.emit, checks=fold.CHECKS, primitives=frozenset({DOT}),
    # drawn at the start of dense programs and among the users' motifs (fuzz/spec.py)
    motif=motif, motif_layouts=("dense",), motif_weight=0, order=4, mutants=(
        RuleMutant("dense_bn_scales_rows", dense_bn_scaling_rows,
                   "BN scale applied along W's input-feature rows"),))


def fold_dense_bn(only: int | None = None) -> Pass:
    """Fold an inference BatchNorm (or any per-feature affine map with a shift) into the Dense
    layer before it: ``x @ (W·s) + b'``. See the module doc."""
    return RULE.make_pass(only)
