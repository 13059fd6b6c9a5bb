"""Rule: fold an inference BatchNorm (any per-channel affine map) into the conv before it (§4.1 rule 1).

Anchor: a conv site (``linear.convs``) whose output feeds per-channel affine ops (``affine``):
``s ⊙ conv(x, W) + t`` with constant s, t, however BatchNorm is written (the named ``batch_norm``
call, flax's and equinox's inline forms, through reshapes, squeezes, transposes and broadcasts).
Emit (``fold``): one named op ``conv_bias(x, W·s, (B − μ)·s + β)``, W scaled along the kernel's
output-feature axis, the movement views replayed after it. A bias add alone is reported as a bias
merge. Refused with the reason: training-mode BN (statistics from the batch), integer division
(not linear), a constant that is not per-channel, an output other ops read too, and the checks of
``fold`` (a non-finite scale, narrow integer weights, folded weights that overflow their dtype).
"""
from __future__ import annotations

from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rules import fold
from mlsys_jax.passes.rules.affine import affine_chain
from mlsys_jax.passes.rules.linear import CONV, conv_bias_body, convs
from mlsys_jax.passes.rules.rule import Refused, Rule


def match(level):
    if level.nested and conv_bias_body(level.jaxpr) is not None:
        return  # inside a conv_bias op: already folded, its bias is the call's argument
    for site in convs(level.jaxpr):
        chain = affine_chain(level, site)
        if chain.refusal:
            yield Refused(site.index, *chain.refusal)
        if chain.end is not None:
            yield fold.fold_match(level, site, chain, f"{chain.aff.describe()} into conv at "
                                                      f"{level.where(site.index)}")


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold inference BatchNorm into the conv's weights and a bias (§4.1)",
    match=match, emit=fold.emit, checks=fold.CHECKS, primitives=frozenset({CONV}))


def fold_conv_bn(only: int | None = None) -> Pass:
    """Fold inference-mode BatchNorm — any per-output-channel ``s * conv(x, W) + t`` with constant
    s, t — into the conv's weights and a bias: one named op ``conv_bias`` (§4.1 rule 1). See the
    module doc for what it recognises and refuses."""
    return RULE.make_pass(only)
