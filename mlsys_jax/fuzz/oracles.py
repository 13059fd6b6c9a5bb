"""Oracles in tiers (docs/verification.md §3): bitwise, float64-referenced error ratio, types, gradients.

A :class:`Reference` is computed once per program (outputs, the float64 program's outputs, and a
derivative probe); :func:`compare` then judges any rewritten jaxpr against it. Programs are
evaluated equation by equation (eager, not one fused XLA program), so "bitwise" means the rewrite
did not change any value — not that two compilations happen to agree.

Integer and boolean outputs are judged bitwise whatever the pass: an integer has no rounding to
allow for. Non-finite values are judged NaN-aware (``max(0.0, nan)`` is 0.0 in Python): a NaN or
Inf where the original was finite is a mismatch, and so is a finite value where the original had
a NaN or Inf (a NaN-unsafe simplification such as x*0 -> 0); elsewhere only finite values are
compared for closeness.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import jax.numpy as jnp
import numpy as np

from mlsys_jax.fuzz.program import build, make_inputs
from mlsys_jax.fuzz.spec import Spec, derivative_mode
from mlsys_jax.fuzz.twin import mirrors, twin_equal
from mlsys_jax.ir import evaluate, signature
from mlsys_jax.passes import registry

__all__ = ["BITWISE", "NUMERIC", "Reference", "Rejected", "Verdict", "compare", "mirrors",
           "reference", "tier", "twin_equal"]

RTOL, ATOL = 1.3e-6, 1e-5          # float32 closeness (docs/verification.md §3)
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
        """The program's outputs evaluated in float64 op by op (computed once, then cached)."""
        if "out" not in self._ref64:
            self._ref64["out"] = evaluate.evaluate(self.closed64, *_inputs64(self))
        return self._ref64["out"]

    @property
    def derivative64(self) -> list:
        """The float64 reference derivative along the probe (computed once, then cached)."""
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
    """A program's derivative in ``mode`` along ``probe``, evaluated op by op."""
    return evaluate.derivative(closed, mode, inputs, probe)


def reference(spec: Spec, closed, seed: int = 0, gradients: bool = True) -> Reference:
    """Evaluate the program and (with ``gradients``) a derivative probe; Rejected if non-finite
    from finite inputs (special inputs are meant to give NaN and Inf)."""
    inputs = make_inputs(spec, seed)
    outputs = evaluate.evaluate(closed, *inputs)
    if not spec.special and not _finite(outputs):
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
        """True when no oracle failed."""
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
    """2, or 3 for tiny tensors and 16-bit floats (docs/verification.md §3)."""
    return 3.0 if x.size <= 16 or np.dtype(x.dtype).itemsize <= 2 else 2.0


def not_bitwise(new, orig) -> str:
    """'' if equal bit for bit, else how they differ (NaN-aware: a NaN never hides a diff)."""
    if new.tobytes() == orig.tobytes():
        return ""
    a, b = new.astype(np.float64), orig.astype(np.float64)
    differ = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    both = differ & np.isfinite(a) & np.isfinite(b)
    diff = np.max(np.abs(a[both] - b[both]), initial=0.0)
    return (f"not bitwise equal ({int(differ.sum())} of {a.size} values differ, max finite "
            f"|diff| {diff:.3g})" if differ.any() else "not bitwise equal (NaN payload or -0.0)")


def finiteness_change(new, orig) -> str:
    """'' if ``new`` is non-finite exactly where ``orig`` is, else what changed (NaN/Inf
    appearing where the original was finite, or a NaN/Inf of the original made finite)."""
    fn, fo = np.isfinite(new.astype(np.float64)), np.isfinite(orig.astype(np.float64))
    gained, lost = int((fo & ~fn).sum()), int((~fo & fn).sum())
    if gained:
        return f"{gained} NaN/Inf value(s) where the original is finite"
    if lost:
        return f"{lost} finite value(s) where the original is NaN/Inf"
    return ""


def _compare_values(what, tier, news, origs, refs, verdict: Verdict, derivative=False,
                    twin=None):
    for i, (new, orig) in enumerate(zip(news, origs)):
        if new.shape != orig.shape or new.dtype != orig.dtype:
            verdict.failures.append(f"{what} {i}: {new.dtype}{list(new.shape)} != "
                                    f"{orig.dtype}{list(orig.shape)}")
            continue
        if tier == BITWISE or not _is_float(orig.dtype):  # integers: exact for every pass
            why = not_bitwise(new, orig)
            if why:
                verdict.failures.append(f"{what} {i}: {why}")
            continue
        why = finiteness_change(new, orig)
        if why:
            verdict.failures.append(f"{what} {i}: {why}")
            continue
        allowed = allowed_ratio(orig) + (1.0 if derivative else 0.0)
        mask = np.isfinite(orig.astype(np.float64))  # non-finite in both: nothing to compare
        new, orig = new[mask], orig[mask]
        if np.allclose(new.astype(np.float64), orig.astype(np.float64), rtol=RTOL, atol=ATOL):
            continue
        ref = np.asarray(refs()[i])[mask]
        if not _finite([ref]):
            verdict.failures.append(f"{what} {i}: not close, and the float64 reference is "
                                    "not finite")
            continue
        kind = "rms" if derivative else "max"
        norm = partial(_err, norm=kind)
        ratio = error_ratio(new, orig, ref, kind)
        verdict.error_ratio = max(verdict.error_ratio, ratio)
        twin_i = twin(i) if ratio > allowed and twin is not None else None
        if twin_i is not None and twin_equal(np.asarray(twin_i)[mask], ref, norm(new, ref), norm):
            verdict.twin_checks += 1  # amplified float32 rounding (see compare), not a bug
            continue
        if ratio > allowed:
            why = f"; {verdict.twin_refused}" if verdict.twin_refused else ""
            verdict.failures.append(f"{what} {i}: error ratio {ratio:.3g} vs float64 reference "
                                    f"(allowed {allowed:g}){why}")


class _Twin:
    """The float64 rewrite (``rewrite64()``, computed when first needed) and, output by output,
    whether the rewrite mirrors it (:func:`mirrors`) where it computes that output; the verdict
    says why where it does not."""

    def __init__(self, ref: Reference, new_closed, rewrite64, verdict: Verdict):
        self.ref, self.new, self.rewrite64, self.verdict = ref, new_closed, rewrite64, verdict
        self.refusals: dict = {}   # output indices (None: all) -> why the twin cannot vouch
        self.values: dict = {}     # 'out' | 'd' -> the twin's outputs | derivatives (None: failed)

    def _new64(self):
        if "new64" not in self.values:
            try:
                self.values["new64"], self.values["why"] = self.rewrite64(), ""
            except Exception as e:  # no twin: the plain error-ratio verdict stands
                self.values["new64"], self.values["why"] = None, \
                    f"no float64 twin ({type(e).__name__})"
        return self.values["new64"]

    def _refusal(self, outputs) -> str:
        new64 = self._new64()
        if new64 is None:
            return self.values["why"]
        try:
            return mirrors(self.new, new64, self.ref.closed, self.ref.closed64,
                           self.ref.spec.dtype, outputs)
        except Exception as e:  # a twin it cannot be compared with vouches for nothing
            return f"no float64 twin to compare with ({type(e).__name__})"

    def vouches(self, outputs) -> bool:
        """Whether the twin may vouch for the outputs at indices ``outputs`` (None: all)."""
        if outputs not in self.refusals:
            self.refusals[outputs] = self._refusal(outputs)
        self.verdict.twin_refused = self.refusals[outputs]
        return not self.refusals[outputs]

    def _run(self, key, compute):
        if key not in self.values:
            try:
                self.values[key] = compute(self.values["new64"], _inputs64(self.ref))
            except Exception:
                self.values[key] = None
        return self.values[key]

    def output(self, i: int):
        """The twin's output ``i`` where the rewrite's output ``i`` mirrors it, else None."""
        if not self.vouches((i,)):
            return None
        outs = self._run("out", lambda new64, xs: evaluate.evaluate(new64, *xs))
        return None if outs is None else outs[i]

    def derivative(self, i: int):
        """The twin's derivative ``i`` where the rewrite mirrors it on what that derivative reads:
        output ``i``'s computation for a JVP, every output's for a VJP (it pulls back them all)."""
        if not self.vouches((i,) if self.ref.mode == "jvp" else None):
            return None
        ds = self._run("d", lambda new64, xs: derivative(new64, xs, self.ref.mode, self.ref.probe))
        return None if ds is None else ds[i]


def compare(ref: Reference, new_closed, tier: str, gradients: bool = True,
            rewrite64=None) -> Verdict:
    """Judge ``new_closed`` against the original program under ``tier``.

    ``rewrite64()`` (optional) returns the same pass applied to the float64 twin of the program.
    When a numeric comparison exceeds its error-ratio allowance, that twin decides: if the rewrite
    :func:`mirrors` the twin's rewrite where it computes that output (the same program at another
    dtype: dead code and the other outputs' computations aside) and the twin computes
    what the float64 program computes (rtol 1e-9), the rewrite is exact in real arithmetic and the
    float32 excess is rounding amplified downstream — measured in the 10k campaign: a ratio of 2.2
    after a BN with variance 1e-6 (scale ~1e3), a relu derivative mask flipped by float16 rounding
    (ratio 99), and f(x) - f(x) whose original is exactly 0 by symmetry while the rewrite leaves
    1e-5 of amplified noise (ratios 9-12). A wrong rewrite differs in float64 too.
    """
    verdict = Verdict()
    twin = None if rewrite64 is None else _Twin(ref, new_closed, rewrite64, verdict)
    if types_of(new_closed) != types_of(ref.closed):
        verdict.failures.append(f"output types {types_of(new_closed)} != {types_of(ref.closed)}")
        return verdict
    try:
        news = evaluate.evaluate(new_closed, *ref.inputs)
    except Exception as e:  # a rewritten program that cannot run is a mismatch, not a crash
        verdict.failures.append(f"rewritten program failed to run: {type(e).__name__}: {e}"[:300])
        return verdict
    _compare_values("output", tier, news, ref.outputs, lambda: ref.ref64, verdict,
                    twin=None if twin is None else twin.output)
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
                        twin=None if twin is None else twin.derivative)
    return verdict


def _inputs64(ref: Reference) -> list:
    return make_inputs(ref.spec, ref.seed, "f64")
