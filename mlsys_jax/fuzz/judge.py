"""Judging one program: every pass runs on it under the verifier, each rewrite against the oracles
(docs/verification.md §3, §4). Campaigns, reproducers and the mutation score all judge programs this way.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from mlsys_jax.fuzz import oracles
from mlsys_jax.fuzz.program import build
from mlsys_jax.fuzz.spec import Spec
from mlsys_jax.ir import rebuild
from mlsys_jax.passes import VerificationError, registry, run


def finite_inputs_only(name: str) -> bool:
    """A pass exact only on finite inputs, as its registry caveat says: on a program whose inputs
    carry NaN/Inf it is judged on the same program's finite inputs instead (the special values
    still reach every other pass)."""
    return registry.entry(name).caveat.startswith(registry.FINITE_ONLY)


@dataclass
class Failure:
    """One failure: which pass, what kind (verifier, mismatch, crash), where it came from."""

    pass_name: str
    kind: str
    message: str
    spec: Spec
    seed: int
    program: int = -1

    @property
    def signature(self) -> tuple:
        """Which pass failed and why, numbers aside: one reproducer per signature."""
        return (self.pass_name, *reason(self.kind, self.message))


def reason(kind: str, message: str) -> tuple:
    """A failure's kind and message with every number replaced by ``#`` (an error ratio or an
    output index may change while a program shrinks; the reason does not)."""
    return kind, re.sub(r"\d[\d.e+-]*", "#", message)


@dataclass
class Outcome:
    """What one program did: rejection reason, rewrites per pass, failures, worst ratio."""

    rejected: str | None = None
    rewrites: dict = field(default_factory=dict)
    failures: list = field(default_factory=list)
    error_ratio: float = 0.0
    twin_checks: int = 0
    validation: list = field(default_factory=list)  # (pass, reason): rewrites validation refused


def apply_pass(p, closed, validate: bool = True):
    """Run one pass with the verifier (docs/verification.md §1) and, with ``validate``, every
    rewrite validated on its region; returns the RunResult."""
    return run(p, closed, verify=True, cost=False, validate=validate)


def fixpoints(closed, passes: dict) -> list[str]:
    """Every registered pass, the default pipeline and everything after ``inline``, each repeated
    to a fixpoint on ``closed``: what fails to converge or revisits a graph (a rewrite cycle)."""
    from mlsys_jax.passes import FixpointError, chain, fixpoint, inline

    loops = [fixpoint(p) for p in passes.values()]
    loops += [fixpoint(registry.pipeline()), fixpoint(chain(inline(), *passes.values()))]
    failed = []
    for p in loops:
        try:
            run(p, closed, verify=True, cost=False)
        except FixpointError as e:
            failed.append(str(e))
        except VerificationError as e:
            failed.append(f"{p.name}: {str(e).splitlines()[0]}")
    return failed


def check_program(spec: Spec, passes: dict, seed: int, gradients: bool = True,
                  validate: bool = True, fixpoint: bool = False) -> Outcome:
    """Run every pass ``{name: Pass}`` on one program and judge it (the tier of each pass comes
    from its registered kind); never raises for a pass's failure. ``validate=False`` judges the
    rules alone, without translation validation refusing their wrong rewrites; ``fixpoint``
    also repeats every pass and pipeline to a fixpoint (:func:`fixpoints`)."""
    out = Outcome()
    try:
        closed = build(spec)
    except Exception as e:  # a generator bug, not a pass bug: reported as a rejection reason
        out.rejected = f"trace failed: {type(e).__name__}"
        return out
    try:
        ref = oracles.reference(spec, closed, seed, gradients)
    except oracles.Rejected as e:
        out.rejected = str(e)
        return out
    v = oracles.compare(ref, rebuild(closed), oracles.BITWISE, gradients=False)
    if not v.ok:
        out.failures.append(Failure("rebuild", "mismatch", v.failures[0], spec, seed))
    finite: dict = {}

    def reference_for(name):  # None: the finite-input program is not a valid case either
        if not (spec.special and finite_inputs_only(name)):
            return ref
        if "ref" not in finite:
            try:
                finite["ref"] = oracles.reference(replace(spec, special=False), closed, seed,
                                                  gradients)
            except oracles.Rejected:
                finite["ref"] = None
        return finite["ref"]

    for name, p in passes.items():
        try:
            result = apply_pass(p, closed, validate)
        except VerificationError as e:
            msg = str(e).splitlines()[0].removeprefix("verifier: ")
            out.failures.append(Failure(name, "verifier", msg, spec, seed))
            continue
        except Exception as e:  # a pass that crashes on valid input is a failure too
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            out.failures.append(Failure(name, "crash", msg[:300], spec, seed))
            continue
        out.rewrites[name] = len(result.rewrites) if result.changed else 0
        out.validation += [(name, r.reason) for r in result.refusals
                           if r.check == "translation_validation"]
        judged_on = reference_for(name) if result.changed else None
        if judged_on is None:
            continue
        v = oracles.compare(judged_on, result.jaxpr, oracles.tier(name),
                            rewrite64=lambda p=p: apply_pass(p, ref.closed64, validate).jaxpr)
        out.error_ratio = max(out.error_ratio, v.error_ratio)
        out.twin_checks += v.twin_checks
        if not v.ok:
            out.failures.append(Failure(name, "mismatch", v.failures[0], spec, seed))
    if fixpoint:
        out.failures += [Failure("fixpoint", "fixpoint", m, spec, seed)
                         for m in fixpoints(closed, passes)]
    return out
