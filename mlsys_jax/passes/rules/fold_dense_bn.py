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
from mlsys_jax.passes.rules import fold
from mlsys_jax.passes.rules.affine import affine_chain
from mlsys_jax.passes.rules.linear import DOT, dots
from mlsys_jax.passes.rules.rule import Refused, Rule


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


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold inference BatchNorm into a Dense layer's weights and bias",
    match=match, emit=fold.emit, checks=fold.CHECKS, primitives=frozenset({DOT}))


def fold_dense_bn(only: int | None = None) -> Pass:
    """Fold an inference BatchNorm (or any per-feature affine map with a shift) into the Dense
    layer before it: ``x @ (W·s) + b'``. See the module doc."""
    return RULE.make_pass(only)
