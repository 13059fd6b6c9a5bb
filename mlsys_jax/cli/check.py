"""Does an optimized function compute what the original computes? ``optimize``'s value check.

Both jaxprs run (compiled together with ``jax.jit``) on the same inputs: a factory's example
arguments, or seeded random values for ``--arg`` specs. Outputs must have equal types, and agree
within a tolerance per dtype: ``|new − old| ≤ atol + rtol · max|old|`` over the output, for the
output's dtype or the least precise float dtype the original computes in, whichever is looser
(a float64 model whose BatchNorm statistics are float32 is folded with float32 rounding).
Integer, boolean and PRNG-key outputs must be equal. A NaN or Inf where the original is finite is a
mismatch, never hidden by a maximum (``max(0.0, nan)`` is 0.0 in Python).
"""
from __future__ import annotations

from dataclasses import dataclass, field

# (rtol, atol) per float dtype: rounding a correct numeric rewrite (a BN folded into a conv)
# stays orders of magnitude below these; a wrong rewrite differs by the output's own size.
TOLERANCES = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-6), "float16": (1e-2, 1e-3),
              "bfloat16": (5e-2, 1e-2)}


@dataclass
class OutputCheck:
    """The worst difference over all outputs, the allowance it is held to, and what failed."""

    max_abs_diff: float = 0.0      # over positions where both outputs are finite
    tolerance: float = 0.0         # the largest allowance of any float output
    new_nonfinite: int = 0         # NaN/Inf in the optimized output where the original is finite
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance,
                "new_nonfinite": self.new_nonfinite, "problems": list(self.problems)}


def tolerance(dtype, scale: float) -> float:
    """The allowance for a float output of ``dtype`` whose largest magnitude is ``scale``."""
    rtol, atol = TOLERANCES.get(str(dtype), TOLERANCES["float32"])
    return atol + rtol * scale


def least_precise_float(closed):
    """The float dtype with the largest machine epsilon among a jaxpr's values (or None)."""
    import jax.numpy as jnp

    from mlsys_jax.ir import walk

    avals = [v.aval for v in closed.jaxpr.invars + closed.jaxpr.constvars]
    avals += [v.aval for _, e in walk(closed) for v in e.outvars]
    floats = {a.dtype for a in avals
              if hasattr(a, "dtype") and jnp.issubdtype(a.dtype, jnp.floating)}
    return max(floats, key=lambda d: jnp.finfo(d).eps, default=None)


def compare_outputs(before, after, inputs) -> OutputCheck:
    """Run both ClosedJaxprs on ``inputs`` and compare every output (see the module doc)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from mlsys_jax.ir.interpret import lifted

    # a factory's parameters, folded in as constants, enter the program as arguments
    (f_old, c_old), (f_new, c_new) = lifted(before), lifted(after)
    old, new = jax.jit(lambda co, cn, *a: (f_old(co, *a), f_new(cn, *a)))(c_old, c_new, *inputs)
    computes_in = least_precise_float(before)
    check = OutputCheck()
    for k, (a, b) in enumerate(zip(old, new)):
        if a.dtype != b.dtype or a.shape != b.shape:
            check.problems.append(f"output {k} is {b.dtype}{list(b.shape)}, was "
                                  f"{a.dtype}{list(a.shape)}")
            continue
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        a, b = np.asarray(a), np.asarray(b)
        if not jnp.issubdtype(a.dtype, jnp.inexact):
            if not np.array_equal(a, b):
                check.problems.append(f"output {k} ({a.dtype}) differs in "
                                      f"{int(np.sum(a != b))} of {a.size} elements")
            continue
        _compare_floats(k, a, b, check, computes_in)
    return check


def _compare_floats(k: int, a, b, check: OutputCheck, computes_in) -> None:
    import jax.numpy as jnp
    import numpy as np

    a64, b64 = (x.astype(np.result_type(x.dtype, np.float64)) for x in (a, b))
    finite_a, finite_b = np.isfinite(a64), np.isfinite(b64)
    new_bad = int(np.sum(finite_a & ~finite_b))
    # where the original is NaN/Inf, the optimized must be the same NaN/Inf
    same_special = (np.isnan(a64) & np.isnan(b64)) | (a64 == b64)
    lost = int(np.sum(~finite_a & ~same_special))
    both = finite_a & finite_b
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: not counted
        diff = float(np.max(np.abs(a64 - b64), where=both, initial=0.0))
    scale = float(np.max(np.abs(a64), where=finite_a, initial=0.0))
    dtype = a.dtype
    if computes_in is not None and jnp.finfo(computes_in).eps > jnp.finfo(dtype).eps:
        dtype = computes_in
    tol = tolerance(dtype, scale)
    check.max_abs_diff = max(check.max_abs_diff, diff)
    check.tolerance = max(check.tolerance, tol)
    check.new_nonfinite += new_bad
    if new_bad:
        check.problems.append(f"output {k}: {new_bad} NaN/Inf value(s) where the original is "
                              "finite")
    if lost:
        check.problems.append(f"output {k}: {lost} NaN/Inf value(s) of the original changed")
    if diff > tol:
        check.problems.append(f"output {k}: max |diff| {diff:.3g} above the {dtype} tolerance "
                              f"{tol:.3g}")
