"""The verifier run after every pass that changed something (TESTING.md §1, like XLA's HloVerifier).

``check_jaxpr`` misses weak_type flips, dropped effects and stale nested params, so we check those
too. Every failure names the pass.
"""
from __future__ import annotations

from collections import Counter

from mlsys_jax.compat import ClosedJaxpr, check_jaxpr
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.keys import signature
from mlsys_jax.ir.primitives import JIT
from mlsys_jax.ir.walk import bodies, walk


class VerificationError(AssertionError):
    """A pass produced a jaxpr that is malformed or computes a different signature/effects."""


def effect_multiset(closed) -> Counter:
    """Effectful equations over all nested bodies: (primitive, effects) with multiplicity."""
    return Counter((e.primitive.name, tuple(sorted(map(str, e.effects))))
                   for _, e in walk(closed) if e.effects)


def require_static_shapes(closed, api: str = "passes") -> None:
    """Symbolic (shape-polymorphic) dimensions are refused with a clear error."""
    for v in list(closed.jaxpr.invars) + list(closed.jaxpr.outvars):
        for d in getattr(v.aval, "shape", ()):
            if not isinstance(d, int):
                raise MlsysError(f"{api}: symbolic dimension {d!r} in {v.aval.str_short()}; the "
                                 "passes need static shapes. Trace with concrete shapes.")


def _nested_param_errors(eqn) -> list[str]:
    p, name, errs = eqn.params, eqn.primitive.name, []
    nin = len(eqn.invars)
    if name in JIT:
        body = p["jaxpr"]
        for key in ("in_shardings", "donated_invars", "in_layouts"):
            if key in p and len(p[key]) != len(body.jaxpr.invars):
                errs.append(f"jit.{key} has {len(p[key])} entries for {len(body.jaxpr.invars)} inputs")
        if len(body.jaxpr.invars) != nin:
            errs.append(f"jit body takes {len(body.jaxpr.invars)} inputs, call passes {nin}")
    elif name == "scan":
        body = p["jaxpr"].jaxpr
        if len(body.invars) != nin or p["num_consts"] + p["num_carry"] > nin:
            errs.append("scan num_consts/num_carry disagree with its body")
    elif name == "while":
        if len(p["cond_jaxpr"].jaxpr.invars) != nin - p["body_nconsts"]:
            errs.append("while cond_nconsts disagrees with cond_jaxpr")
        if len(p["body_jaxpr"].jaxpr.invars) != nin - p["cond_nconsts"]:
            errs.append("while body_nconsts disagrees with body_jaxpr")
    elif name == "cond":
        sigs = {tuple(str(v.aval) for v in b.jaxpr.outvars) for b in p["branches"]}
        if len(sigs) > 1:
            errs.append("cond branches disagree on output types")
        if any(len(b.jaxpr.invars) != nin - 1 for b in p["branches"]):
            errs.append("cond branch arity disagrees with the operands")
    return errs


def verify(pass_name: str, before: ClosedJaxpr, after: ClosedJaxpr, claimed_changed: bool,
           before_hash: str, after_hash: str, input_hash_now: str) -> None:
    """Raise VerificationError (naming ``pass_name``) unless ``after`` is a valid replacement."""
    def fail(msg):
        raise VerificationError(f"verifier: pass {pass_name!r}: {msg}")

    if input_hash_now != before_hash:
        fail("mutated its input jaxpr")
    if not claimed_changed and after_hash != before_hash:
        fail("reported 'unchanged' but the jaxpr differs")
    if not claimed_changed:
        return
    try:
        check_jaxpr(after.jaxpr)
        for _, eqn in walk(after):
            for body in bodies(eqn):
                check_jaxpr(body.jaxpr)
    except Exception as e:  # JaxprTypeError and friends
        fail(f"check_jaxpr failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    if len(after.consts) != len(after.jaxpr.constvars):
        fail(f"{len(after.consts)} consts for {len(after.jaxpr.constvars)} constvars")
    if signature(before) != signature(after):
        fail(f"signature changed: {signature(before)} -> {signature(after)}")
    eb, ea = effect_multiset(before), effect_multiset(after)
    if eb != ea:
        fail(f"effectful equations changed: {dict(eb)} -> {dict(ea)}")
    for path, eqn in walk(after):
        errs = _nested_param_errors(eqn)
        if errs:
            fail(f"at {path}: {errs[0]}")
    require_static_shapes(after, pass_name)
