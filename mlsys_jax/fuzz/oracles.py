"""Oracles in tiers (TESTING.md §3): bitwise, float64-referenced error ratio, types, gradients.

A :class:`Reference` is computed once per program (outputs, the float64 program's outputs, and a
derivative probe); :func:`compare` then judges any rewritten jaxpr against it. Programs are
evaluated equation by equation (eager, not one fused XLA program), so "bitwise" means the rewrite
did not change any value — not that two compilations happen to agree.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.fuzz.build import build, make_inputs
from mlsys_jax.fuzz.spec import Spec, derivative_mode
from mlsys_jax.ir import evaluate, signature, walk
from mlsys_jax.ir.trace import DTYPES
from mlsys_jax.passes import registry

RTOL, ATOL = 1.3e-6, 1e-5          # float32 closeness (TESTING.md §3)
TWIN_RTOL = 1e-9                   # the rewrite on the float64 program vs the float64 program
MIRROR_ULPS = 64                   # constants of the two rewrites agree (measured: ≤ 2.3 ulp)
FLOOR = ATOL / 2                   # err(new) <= k*err(orig) + 1e-5  <=>  ratio <= k
BITWISE, NUMERIC = "bitwise", "numeric"


def tier(pass_name: str) -> str:
    """The oracle tier of a registered pass, from its kind: a structural rewrite must give bitwise
    equal outputs, a numeric one stay within the error-ratio allowance (an identity rebuild and
    remat schedules are held to the bitwise tier where they are judged)."""
    return BITWISE if registry.kind(pass_name) == registry.STRUCTURAL else NUMERIC


class Rejected(Exception):
    """The program is not a valid test case (e.g. its reference output is not finite)."""


@dataclass
class Reference:
    """What the original program computes, once, for every pass to be judged against."""

    spec: Spec
    closed: object
    inputs: list
    outputs: list
    seed: int
    mode: str                      # derivative: 'vjp' | 'jvp' | 'none'
    probe: list = field(default_factory=list)
    derivative: list | None = None
    _ref64: dict = field(default_factory=dict, repr=False)

    # float64 twins are computed only when a float32 comparison is not close: most rewrites are,
    # and each float64 evaluation compiles its own kernels.
    @property
    def closed64(self):
        """The same program in float64 (built once)."""
        if "closed" not in self._ref64:
            self._ref64["closed"] = build(self.spec, "f64")
        return self._ref64["closed"]

    @property
    def ref64(self) -> list:
        if "out" not in self._ref64:
            self._ref64["out"] = evaluate.evaluate(self.closed64, *_inputs64(self))
        return self._ref64["out"]

    @property
    def derivative64(self) -> list:
        if "d" not in self._ref64:
            self._ref64["d"] = derivative(self.closed64, _inputs64(self), self.mode, self.probe)
        return self._ref64["d"]


def _np(xs) -> list:
    return [np.asarray(x) for x in xs]


def _finite(xs) -> bool:
    return all(np.all(np.isfinite(np.asarray(x, np.float64))) for x in xs)


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def derivative(closed, inputs, mode: str, probe: list) -> list:
    return evaluate.derivative(closed, mode, inputs, probe)


def reference(spec: Spec, closed, seed: int = 0, gradients: bool = True) -> Reference:
    """Evaluate the program and (with ``gradients``) a derivative probe; Rejected if non-finite."""
    inputs = make_inputs(spec, seed)
    outputs = evaluate.evaluate(closed, *inputs)
    if not _finite(outputs):
        raise Rejected("non-finite output")
    ref = Reference(spec, closed, inputs, outputs, seed,
                    derivative_mode(spec) if gradients else "none")
    if ref.mode == "none":
        return ref
    rng = np.random.default_rng(seed + 1)
    shapes = [o.shape for o in outputs] if ref.mode == "vjp" else [x.shape for x in inputs]
    ref.probe = [rng.standard_normal(s) for s in shapes]
    d = derivative(closed, inputs, ref.mode, ref.probe)
    if _finite(d):
        ref.derivative = d
    return ref


@dataclass
class Verdict:
    """The judgement of one rewritten jaxpr: failures (empty = pass) and the worst error ratio."""

    failures: list = field(default_factory=list)
    error_ratio: float = 0.0
    twin_checks: int = 0       # ratio over the allowance, but the float64 twin proved equivalence
    twin_refused: str = ""     # why the float64 twin could not vouch for this rewrite

    @property
    def ok(self) -> bool:
        return not self.failures


def types_of(closed) -> list:
    """(shape, dtype, weak_type) of every output."""
    return signature(closed)[1]


def _err(x, ref, norm: str) -> float:
    e = np.abs(np.asarray(x, np.float64) - ref)
    if norm == "rms":
        return float(np.sqrt(np.mean(e * e))) if e.size else 0.0
    return float(np.max(e, initial=0.0))


def error_ratio(new, orig, ref, norm: str = "max") -> float:
    """err(new) / (err(orig) + 5e-6), errors (max-abs, or RMS) against the float64 reference."""
    ref = np.asarray(ref, np.float64)
    return _err(new, ref, norm) / (_err(orig, ref, norm) + FLOOR)


def allowed_ratio(x) -> float:
    """2, or 3 for tiny tensors and 16-bit floats (TESTING.md §3)."""
    return 3.0 if x.size <= 16 or np.dtype(x.dtype).itemsize <= 2 else 2.0


def twin_equal(new64, ref64) -> bool:
    """The rewrite applied to the float64 program computes what the float64 program computes."""
    a, b = np.asarray(new64, np.float64), np.asarray(ref64, np.float64)
    atol = TWIN_RTOL * (1 + np.max(np.abs(b), initial=0))
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=TWIN_RTOL, atol=atol))


def _skeleton(closed) -> tuple:
    """What a program is, dtype aside: (primitive, output shapes) of every equation except casts
    (a float16 sum upcasts, its float64 twin does not), the number of casts, and every constant
    and literal."""
    consts = dict(zip(closed.jaxpr.constvars, closed.consts))
    ops, casts, values = [], 0, []
    for _, eqn in walk(closed):
        for v in eqn.invars:  # constants in order of first use: their list order is arbitrary
            if isinstance(v, Literal):
                values.append(np.asarray(v.val))
            elif v in consts:
                values.append(np.asarray(consts.pop(v)))
        if eqn.primitive.name == "convert_element_type":
            casts += 1
            continue
        ops.append((eqn.primitive.name, tuple(tuple(v.aval.shape) for v in eqn.outvars)))
    return ops, casts, values + [np.asarray(c) for c in consts.values()]


def mirrors(new, new64, orig, orig64, dtype: str) -> str:
    """'' if ``new`` (the rewrite of the program) is ``new64`` (the same pass on the float64 twin)
    in the program's dtype — same equations and shapes, no cast the twin lacks, constants equal
    (the twin's rounded to the program's dtype) to ``MIRROR_ULPS`` ulp of the array's largest
    value; else the reason it is not.

    Only then may the twin vouch for a float32 excess: a pass that behaves differently at the
    program's dtype (say, rounds folded weights to bfloat16 in float32 programs only) leaves the
    twin exact, and would otherwise pass unseen (mutant ``conv_bn_bf16_in_f32``)."""
    (ops, casts, vals), (ops64, casts64, vals64) = _skeleton(new), _skeleton(new64)
    if ops != ops64:
        at = next((i for i, (a, b) in enumerate(zip(ops, ops64)) if a != b),
                  min(len(ops), len(ops64)))
        return (f"the rewrite differs from its float64 twin at equation {at} "
                f"({len(ops)} vs {len(ops64)} equations)")
    if casts - _skeleton(orig)[1] > casts64 - _skeleton(orig64)[1]:
        return "the rewrite adds casts that its float64 twin does not"
    if len(vals) != len(vals64) or any(a.shape != b.shape for a, b in zip(vals, vals64)):
        return "the rewrite's constants differ in number or shape from its float64 twin's"
    ulp = float(jnp.finfo(DTYPES[dtype]).eps)
    for a, b in zip(vals, vals64):
        if _is_float(a.dtype) and _is_float(b.dtype):
            b = np.asarray(b, a.dtype)  # the twin's value as the program holds it (1e-8→0 f16)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        scale = np.max(np.abs(b), initial=0.0)
        if a.size and np.max(np.abs(a - b)) > MIRROR_ULPS * ulp * scale:
            return (f"a constant differs from its float64 twin by "
                    f"{np.max(np.abs(a - b)) / (ulp * scale + 1e-300):.3g} ulp")
    return ""


def _compare_values(what, tier, news, origs, refs, verdict: Verdict, derivative=False,
                    twin=None):
    for i, (new, orig) in enumerate(zip(news, origs)):
        if new.shape != orig.shape or new.dtype != orig.dtype:
            verdict.failures.append(f"{what} {i}: {new.dtype}{list(new.shape)} != "
                                    f"{orig.dtype}{list(orig.shape)}")
            continue
        if tier == BITWISE:
            if new.tobytes() != orig.tobytes():
                diff = np.max(np.abs(new.astype(np.float64) - orig.astype(np.float64)))
                verdict.failures.append(f"{what} {i}: not bitwise equal (max |diff| {diff:.3g})")
            continue
        if not _finite([new]):
            verdict.failures.append(f"{what} {i}: non-finite values")
            continue
        if np.allclose(new.astype(np.float64), orig.astype(np.float64), rtol=RTOL, atol=ATOL):
            continue
        if not _finite([refs()[i]]):
            verdict.failures.append(f"{what} {i}: not close, and the float64 reference is "
                                    "not finite")
            continue
        ratio = error_ratio(new, orig, refs()[i], "rms" if derivative else "max")
        allowed = allowed_ratio(orig) + (1.0 if derivative else 0.0)
        verdict.error_ratio = max(verdict.error_ratio, ratio)
        if ratio > allowed and twin is not None and twin() is not None \
                and twin_equal(twin()[i], refs()[i]):
            verdict.twin_checks += 1  # amplified float32 rounding (see compare), not a bug
            continue
        if ratio > allowed:
            why = f"; {verdict.twin_refused}" if verdict.twin_refused else ""
            verdict.failures.append(f"{what} {i}: error ratio {ratio:.3g} vs float64 reference "
                                    f"(allowed {allowed:g}){why}")


def compare(ref: Reference, new_closed, tier: str, gradients: bool = True,
            rewrite64=None) -> Verdict:
    """Judge ``new_closed`` against the original program under ``tier``.

    ``rewrite64()`` (optional) returns the same pass applied to the float64 twin of the program.
    When a numeric comparison exceeds its error-ratio allowance, that twin decides: if the rewrite
    :func:`mirrors` the twin's rewrite (the same program at another dtype) and the twin computes
    what the float64 program computes (rtol 1e-9), the rewrite is exact in real arithmetic and the
    float32 excess is rounding amplified downstream — measured in the 10k campaign: a ratio of 2.2
    after a BN with variance 1e-6 (scale ~1e3), a relu derivative mask flipped by float16 rounding
    (ratio 99), and f(x) - f(x) whose original is exactly 0 by symmetry while the rewrite leaves
    1e-5 of amplified noise (ratios 9-12). A wrong rewrite differs in float64 too.
    """
    verdict = Verdict()
    cache: dict = {}

    def twin():  # the float64 rewrite, if it mirrors this one; None (and the reason) if not
        if "twin" not in cache:
            cache["twin"] = None
            try:
                new64 = rewrite64()
                verdict.twin_refused = mirrors(new_closed, new64, ref.closed, ref.closed64,
                                               ref.spec.dtype)
                if not verdict.twin_refused:
                    cache["twin"] = new64
            except Exception as e:  # no twin: the plain error-ratio verdict stands
                verdict.twin_refused = f"no float64 twin ({type(e).__name__})"
        return cache["twin"]

    def twin_outputs():
        if "out" not in cache:
            try:
                cache["out"] = None if twin() is None else evaluate.evaluate(twin(),
                                                                            *_inputs64(ref))
            except Exception:
                cache["out"] = None
        return cache["out"]

    def twin_derivative():
        if "d" not in cache:
            try:
                cache["d"] = None if twin() is None else derivative(twin(), _inputs64(ref),
                                                                    ref.mode, ref.probe)
            except Exception:
                cache["d"] = None
        return cache["d"]
    if types_of(new_closed) != types_of(ref.closed):
        verdict.failures.append(f"output types {types_of(new_closed)} != {types_of(ref.closed)}")
        return verdict
    try:
        news = evaluate.evaluate(new_closed, *ref.inputs)
    except Exception as e:  # a rewritten program that cannot run is a mismatch, not a crash
        verdict.failures.append(f"rewritten program failed to run: {type(e).__name__}: {e}"[:300])
        return verdict
    _compare_values("output", tier, news, ref.outputs, lambda: ref.ref64, verdict,
                    twin=twin_outputs if rewrite64 is not None else None)
    if gradients and ref.derivative is not None and verdict.ok:
        try:
            d = derivative(new_closed, ref.inputs, ref.mode, ref.probe)
        except Exception as e:
            verdict.failures.append(f"derivative failed: {type(e).__name__}: {e}"[:300])
            return verdict
        # Derivatives always take the numeric tier: merging two uses of a value (CSE) or removing
        # a call boundary (inline) reorders the sum of cotangents (add_any), which moves the last
        # bit — rounding, not a wrong derivative (measured: 1-4 ulp at f32). And the primal's
        # rounding (allowed up to 2x above) is amplified by nonlinear derivatives — cos'(y) at
        # |y| ~ 100 after a tiny-variance BN gave a max-abs ratio of 3.2, RMS 2.2, for a correct
        # fold (tests/regressions/test_fuzz_fold_conv_bn_vjp_tiny_var.py) — so derivatives are
        # judged on the RMS error with one more unit of slack. Real bugs give ratios >> 10.
        _compare_values(f"{ref.mode}", NUMERIC, d, ref.derivative, lambda: ref.derivative64,
                        verdict, derivative=True,
                        twin=twin_derivative if rewrite64 is not None else None)
    return verdict


def _inputs64(ref: Reference) -> list:
    return make_inputs(ref.spec, ref.seed, "f64")
