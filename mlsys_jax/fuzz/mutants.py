"""Deliberately broken passes (docs/verification.md §4) and the mutation score.

Each mutant wraps or alters the *real* pass at call time — an option it exposes, a module attribute
patched for the duration of one call, or a post-processing step — never by editing its source. The
score is the fraction of mutants that the same campaign (same generator, same oracles) catches, and
after how many programs.
"""
from __future__ import annotations

import contextlib
import time
import types
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mlsys_jax.fuzz.judge import check_program
from mlsys_jax.fuzz.spec import Knobs, generate_seeded, program_seed
from mlsys_jax.passes import basic, registry
from mlsys_jax.passes.rules import enlarge_conv_kernel, fold_conv_bn, merge_parallel_convs


@contextlib.contextmanager
def patched(obj, name: str, value):
    """Temporarily replace ``obj.name`` (restored even on error)."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _during(real, *patches):
    """A Pass running ``real`` with ``patches`` [(obj, name, value)] applied."""
    from mlsys_jax.passes import Pass

    def fn(closed):
        with contextlib.ExitStack() as stack:
            for obj, name, value in patches:
                stack.enter_context(patched(obj, name, value))
            return real(closed)
    return Pass(real.name, fn)


# ---- the mutants -----------------------------------------------------------------------------

def cse_ignoring_params():
    from mlsys_jax.passes import cse

    return cse(param_blind=True)


def dce_dropping_effects():
    """DCE that also deletes effectful equations with no outputs (debug prints, callbacks)."""
    from mlsys_jax.ir import rebuild
    from mlsys_jax.passes import Pass, PassResult, dce

    real = dce()

    def fn(closed):
        r = real(closed)
        drop = lambda eqn, invals: [] if eqn.effects and not eqn.outvars else None  # noqa: E731
        new = rebuild(r.jaxpr, handler=drop)
        return PassResult(new, True, r.rewrites, r.refusals)
    return Pass(real.name, fn)


def folding_clearing_weak_type():
    from mlsys_jax.passes import fold_constants

    return fold_constants(keep_weak=False)


def conv_bn_wrong_channel_axis():
    """fold_conv_bn scaling W along its *input*-feature axis instead of the output one."""
    from mlsys_jax.passes.rules import fold, fold_conv_bn as rule

    def wrong(w, vec, site, dtype):
        shape = [1] * w.ndim
        shape[site.dims.rhs_spec[1]] = -1
        return (np.asarray(w, np.float64) * vec.reshape(shape)).astype(dtype)
    return _during(rule.fold_conv_bn(), (fold, "scale_weights", wrong))


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
    return _during(rule.fold_conv_bn(), (consts.Consts, "value", value))


def conv_bn_bf16_in_f32():
    """fold_conv_bn rounding the folded weights through bfloat16 in float32 programs only (a
    mixed-precision shortcut keyed on the dtype). Its float64 twin is exact, so the float64-twin
    escape of the numeric oracle must not vouch for it: only :func:`oracles.mirrors` catches it."""
    import ml_dtypes
    from mlsys_jax.passes.rules import fold, fold_conv_bn as rule

    real = fold.scale_weights

    def lossy(w, vec, site, dtype):
        out = real(w, vec, site, dtype)
        if isinstance(out, np.ndarray) and out.dtype == np.float32:
            out = out.astype(ml_dtypes.bfloat16).astype(np.float32)
        return out
    return _during(rule.fold_conv_bn(), (fold, "scale_weights", lossy))


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
    from mlsys_jax.passes.rules import affine, linear
    from mlsys_jax.passes.rules.level import Level

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
    from mlsys_jax.passes.rules import linear

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
    return _during(fold_conv_bn.fold_conv_bn(), (linear, "conv_bias_body", shape_only))


def _proxy(module, **overrides):
    """A stand-in for ``module`` (numpy, jax.numpy) with some functions replaced."""
    ns = types.SimpleNamespace(**{k: getattr(module, k) for k in dir(module)
                                  if not k.startswith("__")})
    for k, f in overrides.items():
        setattr(ns, k, f(getattr(module, k)))
    return ns


def merge_concatenating_wrong_axis():
    """merge_parallel_convs concatenating the weights on the axis after the output-feature one."""
    from mlsys_jax.passes.rules import merge_parallel_convs as rule

    def wrong(concatenate):
        def f(arrays, axis=0, **kw):
            nd = np.ndim(arrays[0])
            return concatenate(arrays, axis=(axis + 1) % nd if nd > 1 else axis, **kw)
        return f
    return _during(rule.merge_parallel_convs(), (rule, "np", _proxy(rule.np, concatenate=wrong)),
                   (rule, "jnp", _proxy(rule.jnp, concatenate=wrong)))


def enlarge_off_centre():
    """enlarge_conv_kernel zero-padding the kernel on one side only (the old taps shift)."""
    from mlsys_jax.passes.rules import enlarge_conv_kernel as rule

    def wrong(pad):
        def f(w, pads, *a, **kw):
            return pad(w, [(0, lo + hi) for lo, hi in pads], *a, **kw)
        return f
    return _during(rule.enlarge_conv_kernel(), (rule, "np", _proxy(rule.np, pad=wrong)),
                   (rule, "jnp", _proxy(rule.jnp, pad=wrong)))


@dataclass(frozen=True)
class Mutant:
    """A broken variant: its name, the factory of the registered pass it replaces (None: the
    data-parallel step), how to build it, what it gets wrong, and the campaign's knobs for
    programs of the only kind it can differ on (None: the default mix)."""

    name: str
    breaks: Callable | None
    make: Callable | None
    what: str
    knobs: Knobs | None = None

    @property
    def target(self) -> str:
        """The registered name of the pass it breaks, or 'data_parallel'."""
        return "data_parallel" if self.breaks is None else registry.name_of(self.breaks)


MUTANTS = (
    Mutant("cse_ignores_params", basic.cse, cse_ignoring_params, "CSE keyed without params"),
    Mutant("dce_drops_effects", basic.dce, dce_dropping_effects, "DCE deleting debug callbacks"),
    Mutant("fold_clears_weak_type", basic.fold_constants, folding_clearing_weak_type,
           "constant folding that makes weak-typed results strong"),
    Mutant("conv_bn_wrong_channel_axis", fold_conv_bn.fold_conv_bn, conv_bn_wrong_channel_axis,
           "BN scale applied along W's input-feature axis"),
    Mutant("conv_bn_no_eps", fold_conv_bn.fold_conv_bn, conv_bn_without_eps, "BN folded without eps"),
    Mutant("conv_bn_bf16_in_f32", fold_conv_bn.fold_conv_bn, conv_bn_bf16_in_f32,
           "folded weights rounded to bfloat16 in float32 programs only"),
    Mutant("conv_bn_folds_int_div", fold_conv_bn.fold_conv_bn, conv_bn_folding_int_div,
           "truncating integer division folded into conv weights as if real",
           Knobs(integer=1.0)),  # hunted among integer programs: floats never reach its rule
    Mutant("conv_bias_ignores_the_axis", fold_conv_bn.fold_conv_bn, conv_bias_ignoring_the_axis,
           "a jitted conv + bias taken as per-channel by the bias's length alone"),
    Mutant("merge_concat_wrong_axis", merge_parallel_convs.merge_parallel_convs, merge_concatenating_wrong_axis,
           "parallel convs concatenated on the wrong weight axis"),
    Mutant("enlarge_off_centre", enlarge_conv_kernel.enlarge_conv_kernel, enlarge_off_centre,
           "1x1 kernel zero-padded on one side: the tap moves off centre"),
    Mutant("dp_double_psum", None, None,
           "data-parallel step that psums the already-summed gradient"),
)


def hunt(mutant: Mutant, seed: int = 0, limit: int = 300) -> dict:
    """Run the campaign's programs against one mutant until it is caught (or ``limit``)."""
    from mlsys_jax.fuzz.systems import dp_case

    t0 = time.perf_counter()
    broken = None if mutant.breaks is None else {mutant.target: mutant.make()}
    real = None if broken is None else registry.instantiate([mutant.target])
    for i in range(limit):
        pseed = program_seed(seed, i)
        if broken is None:
            fails = dp_case(pseed, "double_psum")
            if fails is None:
                return {"mutant": mutant.name, "target": mutant.target, "caught": False,
                        "programs": 0, "how": "skipped: needs at least 2 devices", "seconds": 0.0}
            message = fails[0] if fails else None
        else:
            spec = generate_seeded(pseed, mutant.knobs)
            # validation off: the oracles must catch the broken rule itself (translation
            # validation would refuse its rewrites; tests/passes/test_validate.py shows it does)
            out = check_program(spec, broken, pseed, gradients=False, validate=False)
            message = (f"{out.failures[0].kind}: {out.failures[0].message}"
                       if out.failures else None)
            # a catch counts only where the real pass is clean (else the real pass failed)
            if message and check_program(spec, real, pseed, gradients=False,
                                         validate=False).failures:
                message = None
        if message:
            return {"mutant": mutant.name, "target": mutant.target, "caught": True,
                    "programs": i + 1, "how": message[:200],
                    "seconds": round(time.perf_counter() - t0, 2)}
    return {"mutant": mutant.name, "target": mutant.target, "caught": False, "programs": limit,
            "how": None, "seconds": round(time.perf_counter() - t0, 2)}


def mutation_score(seed: int = 0, limit: int = 300, names=None) -> dict:
    """Hunt every mutant; the score is caught / total."""
    chosen = [m for m in MUTANTS if names is None or m.name in names]
    rows = [hunt(m, seed, limit) for m in chosen]
    caught = sum(r["caught"] for r in rows)
    return {"mutants": rows, "caught": caught, "total": len(rows),
            "score": caught / len(rows) if rows else 0.0, "seed": seed, "limit": limit}
