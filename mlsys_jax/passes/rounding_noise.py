"""How far float rounding alone moves each output element of a program: its rounding noise.

The value check (``value_check``) compares an optimized program b with the original a against
the original's float64 twin r. The original's own error at one element, ``|a − r|``, is one draw
of its rounding and can be small by luck: at a logit near zero (a sum of large terms that
cancel), a ResNet-18's float32 head is 6.1e-7 from r at one logit and up to 4.1e-6 at others,
while a correct Conv+BN fold, which only rounds its weights differently, lands 3.1e-6 from r. So the bound
also takes the *scale* of the rounding at that element, measured on the original itself
(Monte Carlo arithmetic, D. S. Parker 1997): the original runs ``RUNS`` times with the result of
every equation that rounds (arithmetic, reductions, contractions, calls and loops, at the top
level) and every float constant multiplied by ``1 + u·eps``, eps its dtype's machine epsilon and
``u`` in [−1, 1) drawn per run from the value itself (a hash of its bits: the same value gets the
same perturbation, as a deterministic rounding gives it the same error, so ``y − y`` stays 0).
σ at an element is the RMS of those runs' deviations from the unperturbed run. A rewrite that
only rounds differently lands within a few σ of the float64 twin (measured on the shipped
ResNet-18, both graphs against the twin over 3 × 2,000 logits: the original ≤ 5.0σ, the folded
graph ≤ 5.9σ, median 0.4σ); a wrong one (a fold without eps, weights rounded to bfloat16) by
thousands of σ and more.

Per element, never pooled: a large, noisy region of an output never widens another element's
allowance. Data movement and exact operations (max, floor, select, comparisons) are left
unperturbed: they do not round, and a perturbed integer-valued float could change an index.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import bind_equation
from mlsys_jax.ir.interpret import eval_jaxpr, with_lifted
from mlsys_jax.ir.primitives import CONTRACTIONS, CONTROL, ELEMENTWISE, REDUCTIONS, \
    SCANS_AND_SORTS, TRANSPARENT_CALLS

RUNS = 8            # perturbed runs per input set: σ from 8 draws (t-distribution, 7 dof)
EXACT = frozenset({"max", "min", "neg", "abs", "sign", "floor", "ceil", "round", "select_n",
                   "clamp", "copy", "copy_p", "stop_gradient", "nextafter", "real", "imag",
                   "conj", "sort", "cummax", "cummin"})
ROUNDING = (ELEMENTWISE | REDUCTIONS | CONTRACTIONS | SCANS_AND_SORTS | TRANSPARENT_CALLS
            | CONTROL) - EXACT


def _is_float(x) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)


def _bits(x):
    """The bits of each element of a float array as uint32 (float64 folded high into low)."""
    width = jnp.finfo(x.dtype).bits
    if width == 64:
        b = jax.lax.bitcast_convert_type(x, jnp.uint64)
        return (b ^ (b >> 32)).astype(jnp.uint32)
    b = jax.lax.bitcast_convert_type(x, {32: jnp.uint32, 16: jnp.uint16, 8: jnp.uint8}[width])
    return b.astype(jnp.uint32)


def _uniform(x, seed):
    """Uniform in [−1, 1) per element, a hash (lowbias32) of the element's *value* and ``seed``:
    rounding is a function of the value computed, so two equations that compute the same value
    get the same perturbation and ``y − y`` stays exactly 0, as it does in the program (an
    index-based draw would invent noise there). Elementwise integer arithmetic: it compiles in a
    fraction of the time ``jax.random`` takes for hundreds of arrays."""
    h = _bits(x) * jnp.uint32(0x9E3779B1) + seed
    for shift, mul in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        h = (h ^ (h >> shift)) * jnp.uint32(mul)
    h = h ^ (h >> 16)
    return (h >> 8).astype(jnp.float32) * (2.0 / (1 << 24)) - 1.0


def _jitter(x, seed):
    """``x·(1 + u·eps)``, in ``x``'s dtype; non-floats unchanged."""
    if not _is_float(x):
        return x
    eps = float(jnp.finfo(x.dtype).eps)
    return (x * (1.0 + eps * _uniform(x, seed))).astype(x.dtype)


def _perturbed(closed, seed, big, *xs) -> list:
    """One run of ``closed`` with its constants and rounding results jittered (traceable)."""
    seed = seed * jnp.uint32(0x85EBCA6B)

    def handler(eqn, vals):
        outs = bind_equation(eqn, vals)
        if eqn.primitive.name in ROUNDING:
            outs = [_jitter(o, seed) for o in outs]
        return outs
    consts = [_jitter(jnp.asarray(c), seed) if _is_float(c) else c
              for c in with_lifted(closed, big)]
    return eval_jaxpr(closed.jaxpr, consts, *xs, handler=handler)


def noise_of(closed, big: list):
    """``noise(xs, plain)``: σ per element of every float output of ``closed`` on inputs ``xs``
    (``plain``: its unperturbed outputs), as float64 arrays (None where an output is not float);
    None when the program cannot run perturbed. ``big``: its lifted constants
    (``ir.interpret.lifted_indices``), passed as arguments, not compiled in."""
    fn, broken = jax.jit(lambda seed, b, *xs: _perturbed(closed, seed, b, *xs)), []

    def noise(xs, plain):
        if broken:
            return None
        try:  # one perturbed run at a time, its squared deviations summed, then dropped
            sums = [None if not jnp.issubdtype(np.asarray(a).dtype, jnp.floating) else 0.0
                    for a in plain]
            for k in range(RUNS):
                run = fn(jnp.uint32(1 + k), big, *xs)
                sums = [s if s is None else _add_square(s, r, np.asarray(a))
                        for s, r, a in zip(sums, run, plain)]
                run = None
        except Exception:  # a primitive that cannot be re-bound so: the twin's bound stands
            broken.append(True)
            return None
        return [s if s is None else np.sqrt(s / RUNS) for s in sums]
    return noise


def _add_square(total, run, plain: np.ndarray):
    """``total + (run − plain)²`` in float64, in place once ``total`` is an array."""
    dev = np.asarray(run, np.float64) - plain.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        np.square(dev, out=dev)
        if isinstance(total, np.ndarray):
            total += dev
            return total
    return dev
