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
import numpy as np
from mlsys_jax.passes.rewrite.mutate import RuleMutant, during
from mlsys_jax.passes.rewrite import fold
from mlsys_jax.passes.rewrite.affine import affine_chain
from mlsys_jax.passes.rewrite.linear import CONV, conv_bias_body, convs
from mlsys_jax.passes.rewrite.rule import Refused, Rule


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


# ---- the fuzzer's side: a motif that makes the rule fire, and its mutants ----------


def motif(g):
    """conv → BN (→ relu): every layout, eps, tiny variance, negative gamma, strides, padding,
    dilation and groups; sometimes a training-mode BN that must be left alone."""
    z = g.conv(g.pick_main())
    if z < 0:
        return
    train = g.c.chance(0.1) and not g.integer
    y = g.add({"op": "train_bn", "args": [z]}) if train else g.bn(z)
    if g.c.chance(0.5):
        g.unary(y, "relu")


def conv_bn_wrong_channel_axis():
    """fold_conv_bn scaling W along its *input*-feature axis instead of the output one."""
    from mlsys_jax.passes.rules import fold_conv_bn as rule

    from mlsys_jax.passes.rewrite import fold
    def wrong(w, vec, site, dtype):
        shape = [1] * w.ndim
        shape[site.dims.rhs_spec[1]] = -1
        return (np.asarray(w, np.float64) * vec.reshape(shape)).astype(dtype)
    return during(rule.fold_conv_bn(), (fold, "scale_weights", wrong))


def conv_bn_without_eps():
    """fold_conv_bn whose constant analysis drops a small literal added to a constant (the eps)."""
    from mlsys_jax.compat import Literal
    from mlsys_jax.ir import consts
    from mlsys_jax.passes.rules import fold_conv_bn as rule

    real_value = consts.Consts.value

    def value(self, v):
        eqn = self.producer.get(v) if not isinstance(v, Literal) else None
        if eqn is not None and eqn.primitive.name == "add":
            lits = [x for x in eqn.invars if isinstance(x, Literal)]
            others = [x for x in eqn.invars if not isinstance(x, Literal)]
            if len(lits) == 1 and len(others) == 1 and 0 < abs(float(lits[0].val)) <= 0.1:
                other = real_value(self, others[0])
                if other is not None:
                    return other
        return real_value(self, v)
    return during(rule.fold_conv_bn(), (consts.Consts, "value", value))


def conv_bn_bf16_in_f32():
    """fold_conv_bn rounding the folded weights through bfloat16 in float32 programs only (a
    mixed-precision shortcut keyed on the dtype). Its float64 twin is exact, so the float64-twin
    escape of the numeric oracle must not vouch for it: only :func:`oracles.mirrors` catches it."""
    import ml_dtypes
    from mlsys_jax.passes.rules import fold_conv_bn as rule

    from mlsys_jax.passes.rewrite import fold
    real = fold.scale_weights

    def lossy(w, vec, site, dtype):
        out = real(w, vec, site, dtype)
        if isinstance(out, np.ndarray) and out.dtype == np.float32:
            out = out.astype(ml_dtypes.bfloat16).astype(np.float32)
        return out
    return during(rule.fold_conv_bn(), (fold, "scale_weights", lossy))


def conv_bn_folding_int_div():
    """fold_conv_bn that also folds a truncating integer division by a constant into the integer
    conv before it, as if it were real division: conv(x, W) / c -> conv(x, trunc(W / c)). Exact
    over the reals, wrong over the integers (trunc(Σ x·w / c) is not Σ x·trunc(w / c)), and what
    the pass once did. Written apart from the real pass, so it stays this bug whatever the real
    pass does."""
    from mlsys_jax.compat import bind_equation
    from mlsys_jax.ir import rebuild
    from mlsys_jax.passes import Pass, PassResult
    from mlsys_jax.passes.rules import fold_conv_bn as rule

    real = rule.fold_conv_bn()

    def fn(closed):
        r = real(closed)
        plan = _int_div_folds(r.jaxpr)
        if not plan:
            return r

        def handler(eqn, invals):  # the conv gets trunc(W / c); the division disappears
            if id(eqn) not in plan:
                return None
            w = plan[id(eqn)]
            return [invals[0]] if w is None else bind_equation(eqn, [invals[0], w])
        return PassResult(rebuild(r.jaxpr, handler), True, r.rewrites, r.refusals)
    return Pass(real.name, fn)


def _int_div_folds(closed) -> dict:
    """{id(conv equation): trunc(W / c), id(div equation): None} for every integer conv (top
    level) whose only use is a division by a constant per output channel."""
    import jax.numpy as jnp

    from mlsys_jax.compat import Var
    from mlsys_jax.passes.rewrite import affine
    from mlsys_jax.passes.rewrite import linear
    from mlsys_jax.passes.rewrite.level import Level

    level = Level(closed)
    plan = {}
    for i, e in enumerate(level.eqns):
        if e.primitive.name != "div" or not jnp.issubdtype(e.outvars[0].aval.dtype, jnp.integer):
            continue
        z, c = e.invars
        cv = level.producer.get(z) if isinstance(z, Var) else None
        if cv is None or cv.primitive.name != linear.CONV or not level.single_use(z, i):
            continue
        w, divisor = level.value(cv.invars[1]), level.value(c)
        if w is None or divisor is None:
            continue
        dims = cv.params["dimension_numbers"]
        try:
            vec = affine.feature_vector(level, c, tuple(z.aval.shape), (dims.out_spec[1],),
                                        "div", np.asarray(divisor).dtype)
        except (affine.Stop, affine.Refuse):
            continue
        shape = [1] * w.ndim
        shape[dims.rhs_spec[0]] = -1
        plan[id(cv)] = np.trunc(np.asarray(w, np.float64) / vec.reshape(shape)).astype(
            np.asarray(w).dtype)
        plan[id(e)] = None
    return plan


def conv_bias_ignoring_the_axis():
    """The conv rules taking a jitted ``conv(x, w) + b`` for a conv with a per-channel bias
    whenever the bias has as many elements as there are channels, whatever axis it is broadcast
    along (a users' helper's ``b[None, None, :, None]`` with H == C)."""
    from mlsys_jax.passes.rewrite import linear
    def shape_only(body):
        j = getattr(body, "jaxpr", body)
        if len(j.invars) != 3 or len(j.outvars) != 1 or getattr(body, "consts", ()):
            return None
        convs = [e for e in j.eqns if e.primitive.name == linear.CONV]
        if len(convs) != 1 or list(convs[0].invars) != list(j.invars[:2]) \
                or j.eqns[-1].primitive.name != "add":
            return None
        fd = convs[0].params["dimension_numbers"].out_spec[1]
        ok = j.invars[2].aval.shape == (convs[0].outvars[0].aval.shape[fd],)
        return convs[0] if ok else None
    return during(fold_conv_bn(), (linear, "conv_bias_body", shape_only))


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="fold inference BatchNorm into the conv's weights and a bias (§4.1)",
    match=match, emit=fold.emit, checks=fold.CHECKS, primitives=frozenset({CONV}),
    motif=motif, motif_weight=2, order=1, mutants=(
        RuleMutant("conv_bn_wrong_channel_axis", conv_bn_wrong_channel_axis,
                   "BN scale applied along W's input-feature axis"),
        RuleMutant("conv_bn_no_eps", conv_bn_without_eps, "BN folded without eps"),
        RuleMutant("conv_bn_bf16_in_f32", conv_bn_bf16_in_f32,
                   "folded weights rounded to bfloat16 in float32 programs only"),
        # hunted among integer programs: floats never reach its rule
        RuleMutant("conv_bn_folds_int_div", conv_bn_folding_int_div,
                   "truncating integer division folded into conv weights as if real",
                   {"integer": 1.0}),
        # hunted among square images with a users' helper: it differs only where a bias runs
        # along H and H == C
        RuleMutant("conv_bias_ignores_the_axis", conv_bias_ignoring_the_axis,
                   "a jitted conv + bias taken as per-channel by the bias's length alone",
                   {"image": 1.0, "square": 1.0, "user": 1.0})))


def fold_conv_bn(only: int | None = None) -> Pass:
    """Fold inference-mode BatchNorm — any per-output-channel ``s * conv(x, W) + t`` with constant
    s, t — into the conv's weights and a bias: one named op ``conv_bias`` (§4.1 rule 1). See the
    module doc for what it recognises and refuses."""
    return RULE.make_pass(only)
