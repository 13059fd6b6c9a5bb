"""The float64 twin of a rewrite (oracles.compare, refinement 1): may it vouch for a float32 excess?

The same pass run on the float64 program vouches for a rewrite only if that rewrite computes what
the float64 program computes (:func:`twin_equal`) and the float32 rewrite *mirrors* it
(:func:`mirrors`): the same program at another dtype.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.ir.walk import bodies, walk
from mlsys_jax.ir.trace import DTYPES

TWIN_RTOL = 1e-9                   # the rewrite on the float64 program vs the float64 program
# A rounding error shrinks ~5e8× from float32 to float64 (their epsilons); a wrong rewrite's does
# not shrink at all. 1e-6 leaves 500× of slack for rounding's growth with the values' magnitudes.
PRECISION_SCALING = 1e-6
MIRROR_ULPS = 64                   # constants of the two rewrites agree (measured: ≤ 2.3 ulp)


def _is_float(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.floating)


def twin_equal(new64, ref64, err32: float = 0.0, norm=None) -> bool:
    """The rewrite applied to the float64 program computes what the float64 program computes:
    close (rtol 1e-9), or — given ``err32``, the float32 rewrite's error against ``ref64`` under
    ``norm(x, ref)`` — an error that shrinks with the precision as rounding does.

    The second test is for results that cancel: ``g(x) - g(x)`` is exactly 0 in the original,
    by symmetry, and a rewrite that reorders the sum (inline and CSE reorder the cotangents'
    ``add_any``) leaves one rounding of the *terms*, which can be 1e16 when the result is 0
    (measured: a VJP through x²·x³ after a tiny-variance BN, float32 error 1e7 RMS). No tolerance
    relative to the result can accept that and still reject a bug; but rounding error scales with
    the machine epsilon (float64 has 2⁻²⁹ of float32's) while a wrong rewrite's error does not. So
    the twin also vouches when its error is at most PRECISION_SCALING of the float32 error."""
    a, b = np.asarray(new64, np.float64), np.asarray(ref64, np.float64)
    if a.shape != b.shape:
        return False
    atol = TWIN_RTOL * (1 + np.max(np.abs(b), initial=0))
    if np.allclose(a, b, rtol=TWIN_RTOL, atol=atol):
        return True
    return bool(err32 > 0 and norm is not None and norm(a, b) <= PRECISION_SCALING * err32)


def _cone(jaxpr, outputs) -> list:
    """The top-level equations the outputs at indices ``outputs`` are computed by, in order: the
    rest (another output's computation, dead code) cannot change those outputs."""
    need = {v for i in outputs if not isinstance(v := jaxpr.outvars[i], Literal)}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if any(v in need for v in eqn.outvars):
            kept.append(eqn)
            need.update(v for v in eqn.invars if not isinstance(v, Literal))
    return kept[::-1]


def _skeleton(closed, outputs=None) -> tuple:
    """What the outputs at indices ``outputs`` (None: all) are computed by, dtype aside:
    (primitive, output shapes) of every equation of their cone (:func:`_cone`, into nested
    bodies) except casts (a float16 sum upcasts, its float64 twin does not), the number of casts,
    and every constant and literal they read."""
    jaxpr = closed.jaxpr
    outputs = range(len(jaxpr.outvars)) if outputs is None else outputs
    consts = dict(zip(jaxpr.constvars, closed.consts))
    ops, casts, values = [], 0, []

    def read(v):  # constants in order of first use: their list order is arbitrary
        if isinstance(v, Literal):
            values.append(np.asarray(v.val))
        elif v in consts:
            values.append(np.asarray(consts.pop(v)))
    for top in _cone(jaxpr, outputs):
        for eqn in (top, *(e for b in bodies(top) for _, e in walk(b.jaxpr))):
            for v in eqn.invars:
                read(v)
            if eqn.primitive.name == "convert_element_type":
                casts += 1
                continue
            ops.append((eqn.primitive.name, tuple(tuple(v.aval.shape) for v in eqn.outvars)))
    for i in outputs:  # an output that is a constant itself
        read(jaxpr.outvars[i])
    return ops, casts, values


def mirrors(new, new64, orig, orig64, dtype: str, outputs=None) -> str:
    """'' if ``new`` (the rewrite of the program) is ``new64`` (the same pass on the float64 twin)
    in the program's dtype, where it computes the outputs at indices ``outputs`` (None: all) —
    same equations and shapes, no cast the twin lacks, constants equal (the twin's rounded to the
    program's dtype) to ``MIRROR_ULPS`` ulp of the array's largest value; else the reason it is
    not.

    Only then may the twin vouch for a float32 excess: a pass that behaves differently at the
    program's dtype (say, rounds folded weights to bfloat16 in float32 programs only) leaves the
    twin exact, and would otherwise pass unseen (mutant ``conv_bn_bf16_in_f32``). What the
    outputs are not computed by is left out on all four sides: a site folded at one dtype only
    (a float16 variance that is subnormal is no known constant) is another output's business,
    and dead code that only the float64 program has (the cast of a float32 draw) is no cast
    the rewrite added."""
    (ops, casts, vals), (ops64, casts64, vals64) = (_skeleton(new, outputs),
                                                    _skeleton(new64, outputs))
    if ops != ops64:
        at = next((i for i, (a, b) in enumerate(zip(ops, ops64)) if a != b),
                  min(len(ops), len(ops64)))
        return (f"the rewrite differs from its float64 twin at equation {at} "
                f"({len(ops)} vs {len(ops64)} equations)")
    if casts - _skeleton(orig, outputs)[1] > casts64 - _skeleton(orig64, outputs)[1]:
        return "the rewrite adds casts that its float64 twin does not"
    if len(vals) != len(vals64) or any(a.shape != b.shape for a, b in zip(vals, vals64)):
        return "the rewrite's constants differ in number or shape from its float64 twin's"
    ulp = float(jnp.finfo(DTYPES[dtype]).eps)
    for a, b in zip(vals, vals64):
        if _is_float(a.dtype) and _is_float(b.dtype):
            b = np.asarray(b, a.dtype)  # the twin's value as the program holds it (1e-8→0 f16)
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        finite = np.isfinite(a) & np.isfinite(b)
        if not np.array_equal(a[~finite], b[~finite], equal_nan=True):  # Inf - Inf is no ulp
            return "a constant's Inf/NaN differ from its float64 twin's"
        a, b = a[finite], b[finite]
        scale = np.max(np.abs(b), initial=0.0)
        if a.size and np.max(np.abs(a - b)) > MIRROR_ULPS * ulp * scale:
            return (f"a constant differs from its float64 twin by "
                    f"{np.max(np.abs(a - b)) / (ulp * scale + 1e-300):.3g} ulp")
    return ""
