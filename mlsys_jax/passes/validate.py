"""Translation validation: every rewrite is checked where it happens, before it is kept.

The structural verifier (``passes/verify.py``) cannot see a bias moved to the wrong axis, and the
fuzzer only finds what its grammar draws. Like Alive2 and TASO we check rewrites, but each
*instance*: a rewrite touches a small :class:`Region` — the equations it replaces, as a function
of the values they read that are not constants (its inputs; constants are the values the program
holds) — so the region and its replacement can run side by side, cheaply, on seeded inputs: two
random draws and one of special values (0, ±1, large, tiny and, where the dtype has them,
subnormal; integers: their extremes; docs/verification.md §1).

- In float64 (``ir.widen``: every float widened; the replacement computed from the same constants
  in float64, not rounded to the program's dtype) every output element must agree to
  ``1e-9·(|original| + rms(original))`` plus a millionth of the original's own rounding error at
  that element (the program-dtype evaluation against the float64 one): an algebraically exact
  rewrite differs by ~1e-15, a wrong one by O(1), so the test needs no tuning. Constants are the
  program's values on both sides; where a removed equation reads constants alone, the region has
  several float64 meanings (:func:`_meanings`) and agreeing with one is agreeing.
- In the program's own dtypes every value must stay finite where the original's is (folded
  constants overflowing float16's 65504 make Inf) and integer and boolean results stay exact.

Regions whose inputs are large run on one vector (every axis but the last cut to one row) or one
example of their batch, where the rows provably compute the same function, and a conv's image on
the fewest pixels that meet every border type of its window (``ir.rebatch``: the same verdict);
regions whose linear site's weights are large, on a cut of its output features
(``passes/feature_cut.py``: a verdict on those features, and the log line says which), once
every feature of the constants the rewrite ships is shown to be the rule's own on a cut
(``feature_cut.coverage``; else the region is validated whole). On one row of its batch (cut
from more rows than the draws, or traced with one), the draws run at once as rows of one
evaluation (:func:`_stacked_pass`), each judged on its own row; all but a pass is judged again
draw by draw.

A region shape validated often in one process (``COMPILED``; ``validate_compiled.COMPILE_AFTER``
times) is validated compiled: the region and its replacement one XLA program, run on every draw
in one call and shared by the regions of the same structure (``passes/validate_compiled.py``);
what fails there is judged again eagerly, whose verdict and reason stand.

A rewrite that fails is not applied; the rule logs a refusal with the measured reason. ``run``
validates by default (``passes.run(..., validate=False)`` turns it off for speed measurements); a
pass called directly, like a pipeline called directly, runs without the checks.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal, Tracer, bind_equation, eval_context
from mlsys_jax.contexts import setting
from mlsys_jax.ir import numpy_eval, numpy_rules
from mlsys_jax.ir.consts import is_pure
from mlsys_jax.ir.evaluate import eval_equation
from mlsys_jax.ir.precision import coarsest
from mlsys_jax.ir.precision import narrow as narrow_dtype
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.ir import rebatch, shared_contractions
from mlsys_jax.ir.rebatch import Unshrinkable, rebind
from mlsys_jax.ir.scaled import Scaled, output_scale
from mlsys_jax.ir.walk import bodies
from mlsys_jax.ir.widen import bind_widened_blocks, is_float, literal_value, widen_value
from mlsys_jax.passes import feature_cut, validate_compiled

RTOL_F64 = 1e-9            # per element, float64: a wrong rewrite is off by O(1)
ROUNDING_SHARE = 1e-6      # of the original's own rounding error (program dtype vs float64)
DRAWS = 3                  # two random draws and one of special values
# In a bfloat16/float16 region the replacement's error against float64, in the program's
# dtypes, may be this many times the original's (max and rms over an output): equal rounding
# in another order, not a loss of precision.
PRECISION_MARGIN = 2.0
# Regions whose inputs are this large run on one vector or example (``ir.rebatch``): a
# convolution at a real model's size, several times, in two dtypes, costs seconds; a small
# region runs whole, on the kernels its program's own evaluation compiled already.
ONE_ROW_ABOVE = 1 << 15
# A conv of this many multiply-adds runs on a crop of its image however few pixels it has: its
# weights are the cost (ResNet-50's last stage, 3×3×512×512 on 7×7, 0.1 G a draw).
CROP_MACS = 1 << 22
_ON = contextvars.ContextVar("mlsys_jax_validate", default=False)
# After how many validations of a region's shape in this process it is validated compiled and
# batched (``passes/validate_compiled.py``; failures are judged again eagerly): None, the
# module's ``COMPILE_AFTER``; 0, never (every region eagerly, the reference the compiled path is
# tested against); 1, from the first (:func:`compiled`).
COMPILED = contextvars.ContextVar("mlsys_jax_validate_compiled", default=None)


def compiled(after: int | None = 1):
    """Inside, a region shape is validated compiled once seen ``after`` times (0: never)."""
    return setting(COMPILED, after)


def validating(on: bool = True):
    """Rewrites made inside are validated (``passes.run`` and the search enter this)."""
    return setting(_ON, bool(on))


def enabled() -> bool:
    return _ON.get()


@dataclass(frozen=True)
class Region:
    """The equations a rewrite replaces and the constant subgraphs they read, in program order;
    the non-constant values they read (``inputs``); the constants those subgraphs start from
    (``consts``: var -> value: the program's constants, literals aside); the values the rewrite
    replaces (``outputs``); which of ``eqns`` the rewrite removes (``removed``: their ids); and
    the linear site it rewrites, if any (``site``: what a cut of its features needs).
    Those are evaluated as computations even where all they read is constant (a conv of a
    constant), so the float64 comparison widens them; the constant subgraphs are the program's
    constants, in its dtypes, as the rewrite reads them."""

    eqns: tuple
    inputs: tuple
    consts: dict
    outputs: tuple
    removed: frozenset = frozenset()
    site: feature_cut.Site | None = None


# ---- inputs ------------------------------------------------------------------------------------

def special_values(dtype) -> np.ndarray:
    """0, ±1, ±large, ±tiny, ±subnormal (floats) or the extremes (integers) of ``dtype``.
    Large is the dtype's max to the ¼, so a product of a few of them stays finite."""
    if dtype == np.bool_:
        return np.array([False, True])
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return np.array([0, 1, -1, info.min, info.max, info.min + 1, info.max - 1], dtype)
    fi = jnp.finfo(dtype)
    large, tiny = float(fi.max) ** 0.25, float(fi.tiny)
    vals = [0.0, 1.0, -1.0, large, -large, tiny, -tiny]
    sub = float(fi.smallest_subnormal) if hasattr(fi, "smallest_subnormal") else 0.0
    if 0 < sub < tiny:
        vals += [4 * sub, -4 * sub]
    return np.asarray(vals, np.float64).astype(dtype)


_DRAWN: OrderedDict = OrderedDict()  # (shape, dtype, k) -> that draw, read-only: rules
DRAWN_BYTES = 1 << 22  # validate the same shapes again and again (each conv of a model, a search's
DRAWN_KEPT = 64        # graphs); the most recently used are kept (a process that validated other
# models first, a benchmark's, still keeps the draws of the one it validates now)


def draw(shape: tuple, dtype, k: int):
    """Input ``k`` of ``DRAWS`` of ``shape`` and ``dtype`` (seeded; k = DRAWS-1: the special
    values, in a seeded arrangement), read-only."""
    key = (tuple(shape), np.dtype(dtype), k)
    got = _DRAWN.get(key)
    if got is not None:
        _DRAWN.move_to_end(key)
        return got
    got = np.asarray(_draw(*key))
    got.flags.writeable = False
    if got.nbytes <= DRAWN_BYTES:
        _DRAWN[key] = got
        while len(_DRAWN) > DRAWN_KEPT:
            _DRAWN.popitem(last=False)
    return got


def _draw(shape: tuple, dtype, k: int):
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(k)
    if k == DRAWS - 1:
        vals = special_values(dtype)
        return vals[rng.integers(len(vals), size=shape)]
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-8 if k == 0 else -1000, 9 if k == 0 else 1001, shape).astype(dtype)
    scale = 1.0 if k == 0 else 4.0
    return (scale * rng.standard_normal(shape) + (0.0 if k == 0 else 1.0)).astype(dtype)


# ---- evaluation --------------------------------------------------------------------------------

def _constants(eqns, env: dict) -> None:
    """Into ``env``: every value of ``eqns`` (and of their calls' bodies) computed from constants
    alone, by the equations themselves, as XLA:CPU's kernels compute them — independently of the
    rule's own constant analysis, which a broken rule may have got wrong. ``env`` holds the
    constants to start from."""
    def read(v):
        return literal_value(v, False) if type(v) is Literal else env.get(v, _UNKNOWN)
    for eqn in eqns:
        vals = [read(v) for v in eqn.invars]
        inner = bodies(eqn) if eqn.primitive.name in TRANSPARENT_CALLS else []
        if all(x is not _UNKNOWN for x in vals) and is_pure(eqn):
            outs = numpy_rules.evaluate(eqn, vals)  # XLA's bits, no kernel to compile
            env.update(zip(eqn.outvars, outs if outs is not None else bind_equation(eqn, vals)))
        elif len(inner) == 1:
            b = inner[0]
            sub = dict(zip(b.jaxpr.constvars, b.consts))
            sub.update((v, x) for v, x in zip(b.jaxpr.invars, vals) if x is not _UNKNOWN)
            _constants(b.jaxpr.eqns, sub)
            env.update((v, x) for v, x in sub.items() if v not in b.jaxpr.invars)
            outs = [literal_value(v, False) if type(v) is Literal else sub.get(v, _UNKNOWN)
                    for v in b.jaxpr.outvars]
            env.update((v, x) for v, x in zip(eqn.outvars, outs) if x is not _UNKNOWN)


_UNKNOWN = object()


def _run(eqns, env: dict, widen: bool, given: dict, picks=None) -> None:
    """Evaluate ``eqns`` into ``env``; values in ``given`` (the region's constants,
    :func:`_constants`) are taken as they are — constants of the program, in its dtypes, even
    when widening — and everything computed from an input is widened (where an equation reads
    it: :func:`approximate`). Calls run their bodies; ``picks``: a cut's features
    (``ir.rebatch``)."""
    def read(v):
        return literal_value(v, widen) if type(v) is Literal else env[v]
    for eqn in eqns:
        if eqn.outvars and all(v in given for v in eqn.outvars):
            env.update((v, given[v]) for v in eqn.outvars)
            continue
        inner = bodies(eqn) if eqn.primitive.name in TRANSPARENT_CALLS else []
        vals = list(map(read, eqn.invars))
        if len(inner) == 1:
            b = inner[0]
            sub = {v: given.get(v, c) for v, c in zip(b.jaxpr.constvars, b.consts)}
            sub.update(zip(b.jaxpr.invars, vals))
            _run(b.jaxpr.eqns, sub, widen, given, picks)
            outs = [literal_value(v, widen) if type(v) is Literal else sub[v]
                    for v in b.jaxpr.outvars]
        else:
            outs = rebind(eqn, vals, partial(approximate, widen=widen), picks)
        env.update(zip(eqn.outvars, outs))


def approximate(eqn, args, widen: bool) -> list:
    """One equation as validation computes it: NumPy where it has the primitive
    (``ir.numpy_eval``: no kernel to compile), else XLA; in float64 when ``widen`` (``args``
    widened here, a contraction's large weights a block at a time: ``ir.widen``, a conv's
    narrow kernel in cache: ``numpy_eval.conv_widened``), a contraction computed before on the
    same operands, or as a float32 conv's twin, taken (``ir.shared_contractions``); bound on
    tracers where the replacement is traced for its constants (``feature_cut.coverage``)."""
    if widen and any(isinstance(a, Scaled) for a in args):
        return _scaled(eqn, args)
    traced = feature_cut.bind_traced(eqn, args, widen)
    if traced is not None:
        return traced
    if widen:
        outs = shared_contractions.lookup(eqn, args)
        if outs is not None:
            return outs
        outs = bind_widened_blocks(eqn, args)
        if outs is None:
            outs = numpy_eval.conv_widened(eqn, args)
        if outs is None:
            outs = eval_equation(eqn, list(map(widen_value, args)), True)
        return shared_contractions.remember(eqn, args, outs)
    if len(eqn.outvars) == 1:
        got = shared_contractions.with_twin(eqn, args)
        if got is None:
            got = numpy_eval.evaluate(eqn, args, eqn.outvars[0].aval.dtype)
        if got is not None:
            return got
    return eval_equation(eqn, args, False)


MODEST = 1e150  # a float64 scale below this in magnitude factors out of a contraction exactly


def _scaled(eqn, args) -> list:
    """A float64 contraction reading a fold's scaled weights (``ir.scaled``) computed on the
    weights, its output scaled — the contraction of the unscaled weights is then the region's own
    (``ir.shared_contractions``); anything else, on the product materialized."""
    k = [i for i, a in enumerate(args) if isinstance(a, Scaled)]
    w = args[k[0]]
    scale = None
    if len(k) == 1 and len(eqn.outvars) == 1 and np.all(np.abs(w.vec) < MODEST) \
            and not any(isinstance(a, (Tracer, feature_cut.TracedValue)) for a in args):
        scale = output_scale(eqn, k[0], w, len(eqn.outvars[0].aval.shape))
    if scale is None:
        return approximate(eqn, [np.asarray(a) if isinstance(a, Scaled) else a for a in args],
                           widen=True)
    (z,) = approximate(eqn, [w.base if i == k[0] else a for i, a in enumerate(args)], widen=True)
    return [np.asarray(z) * scale]


def _evaluate(region: Region, inputs: list, widen: bool, given: dict, cut=None) -> list:
    env = {v: (widen_value(x) if widen else x) for v, x in zip(region.inputs, inputs)}
    env.update(given)
    with rebatch.side():
        _run(region.eqns, env, widen, given, None if cut is None else cut.picks)
    return [np.asarray(widen_value(env[v]) if widen else env[v]) for v in region.outputs]


def _replaced(region: Region, replacement: Callable, inputs: list, widen: bool,
              cut=None) -> list:
    values = {v: (widen_value(x) if widen else x) for v, x in zip(region.inputs, inputs)}
    with rebatch.side():
        outs = replacement(values.__getitem__, widen) if cut is None else \
            replacement(values.__getitem__, widen, cut)
    return [np.asarray(outs[v]) for v in region.outputs]


# ---- judging -----------------------------------------------------------------------------------

def _where(flat_index: int, shape) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat_index, shape)) if shape else ()


def _exact(k, i, a, b) -> str | None:
    if np.array_equal(a, b):
        return None
    bad = np.flatnonzero(a != b)
    at = _where(bad[0], a.shape)
    return (f"output {k} ({a.dtype}) differs on input {i}: {bad.size} of {a.size} elements "
            f"(element {at}: {a[at]} vs {b[at]})")


def _isfinite(x):
    """``np.isfinite`` of NumPy's floats in place, of others (bfloat16) widened."""
    return np.isfinite(x) if x.dtype.kind == "f" else np.isfinite(x.astype(np.float64))


def _finite(k, i, a, b) -> str | None:
    new = _isfinite(a) & ~_isfinite(b)
    if not new.any():
        return None
    return (f"output {k} in {a.dtype} on input {i}: {int(new.sum())} of {a.size} values Inf/NaN "
            "where the original is finite")


def _nonfinite_alike(a, b, fa) -> bool:
    """``b`` has Inf and NaN where ``a`` has them (``fa``: where ``a`` is finite), each Inf of
    the same sign; a NaN agrees with a NaN."""
    fb = np.isfinite(b)
    if fa.all():
        return bool(fb.all())
    return np.array_equal(fa, fb) and np.array_equal(a[~fa], b[~fa], equal_nan=True)


def _close64(k, i, a, b, a_prog) -> str | None:
    fa = np.isfinite(a)
    if not _nonfinite_alike(a, b, fa):
        return (f"output {k} in float64 on input {i}: Inf/NaN in "
                f"{int((fa != np.isfinite(b)).sum())} other places than the original's")
    if not fa.any():
        return None
    rms = float(np.sqrt(np.mean(np.square(a[fa]))))
    with np.errstate(invalid="ignore"):  # (Inf - Inf where both are Inf: masked)
        own = np.where(np.isfinite(a_prog), np.abs(a_prog.astype(np.float64) - a), 0.0)
        err = np.where(fa, np.abs(a - b), 0.0)
    tol = RTOL_F64 * (np.abs(a) + rms) + ROUNDING_SHARE * own
    bad = err > tol
    if not bad.any():
        return None
    rel = err / (np.abs(a) + rms + 1e-300)
    worst = int(np.argmax(np.where(bad, rel, -1.0)))
    at = _where(worst, a.shape)
    return (f"output {k} differs in float64 on input {i}: {int(bad.sum())} of {a.size} elements "
            f"beyond rounding, max relative error {float(rel.flat[worst]):.3g} "
            f"(element {at}: {float(a[at]):.6g} vs {float(b[at]):.6g})")


def _one_row(region: Region):
    """The inputs' shapes cut to one example (axis 0), or None when none has more than one."""
    return _cut_rows(region, 1)


def _one_vector(region: Region):
    """The inputs' shapes cut to one position along every axis but the last (a sequence's
    tokens, an image's pixels: one example's one row of features), or None where that is no
    fewer than one example."""
    rows = _cut_rows(region, None)
    return rows if rows != _one_row(region) else None


def _cropped(region: Region):
    """The inputs' shapes cut to one example, the image a conv of the region reads cropped to
    the fewest pixels that meet every border type of the conv (``ir.rebatch``: the same verdict
    as on the whole image), or None where no conv reads an input or the region is small (its
    inputs, and the conv's work: ``CROP_MACS``)."""
    whole = [tuple(v.aval.shape) for v in region.inputs]
    rows = _one_row(region) or whole
    for e in region.eqns:
        if e.primitive.name != "conv_general_dilated" or e.invars[0] not in region.inputs:
            continue
        if not _large(whole) and numpy_eval.macs(e) < CROP_MACS:
            return None
        k = region.inputs.index(e.invars[0])
        image = list(rows[k])
        for axis, geometry in zip(e.params["dimension_numbers"].lhs_spec[2:],
                                  rebatch.window_geometry(e.params, e.invars[1].aval.shape)):
            image[axis] = rebatch.crop_length(image[axis], **geometry)
        if tuple(image) != rows[k]:
            return rows[:k] + [tuple(image)] + rows[k + 1:]
        return None
    return None


def _large(shapes: list) -> bool:
    """The largest input has ``ONE_ROW_ABOVE`` elements or more: worth validating on fewer."""
    return max((math.prod(s) for s in shapes), default=0) >= ONE_ROW_ABOVE


def _cut_rows(region: Region, axes: int | None):
    """The inputs' shapes with their first ``axes`` axes (None: all but the last) cut to one
    row, where the largest input has ``ONE_ROW_ABOVE`` elements or more; else None."""
    shapes = [tuple(v.aval.shape) for v in region.inputs]
    if not _large(shapes):
        return None
    cut = [tuple(1 if a < (len(s) - 1 if axes is None else axes) else n
                 for a, n in enumerate(s)) for s in shapes]
    return cut if cut != shapes else None


def validate(region: Region, replacement: Callable) -> str | None:
    """None if the rewrite computes what ``region`` computes (see the module doc), else the
    measured reason it does not (naming the features checked, on a cut). ``replacement(read,
    widen[, cut])`` returns ``{output var: value}`` computed from ``read(input var)``;
    ``widen``: in float64; ``cut``: on some output features (``feature_cut.Cut``)."""
    return check(region, replacement)[0]


def check(region: Region, replacement: Callable) -> tuple:
    """``(reason or None, scope)``: :func:`validate`'s verdict and what it covers — None for the
    whole region, else the cut's description (``feature_cut.Cut.describe``). The region runs on
    one example of its batch where every equation of both sides provably treats examples alike,
    a conv's image cropped where its border types are kept (``ir.rebatch``), on a cut of its
    site's output features where its weights are large, no equation mixes the features and
    every feature of the constants the rewrite ships is the rule's own on a cut
    (``feature_cut.coverage``), else whole."""
    for v in region.inputs:
        if jax.dtypes.issubdtype(v.aval.dtype, jax.dtypes.extended):
            return (f"cannot validate: the region reads a {v.aval.dtype} value, which has no "
                    "draws"), None
    if not region.outputs:
        return None, None
    whole = [tuple(v.aval.shape) for v in region.inputs]
    cut, note = _covered_cut(region, replacement)
    # Cheapest first: the cut on one vector (or a conv's crop), on one row, on the whole batch,
    # then the region on one vector (or the crop), on one row. The last attempt, the whole
    # region (below), is the only one whose failure is the verdict.
    cuts = (cut, None) if cut is not None else (None,)
    crop = _cropped(region)
    small = (crop,) if crop is not None else (_one_vector(region),)
    batches = [b for b in small + (_one_row(region),) if b is not None] + [whole]
    attempts = [(shapes, c) for c in cuts for shapes in batches][:-1]
    for shapes, c in attempts:
        try:
            why = _validate(region, replacement, shapes, c)
        except Unshrinkable:
            continue
        except (TypeError, ValueError, IndexError):
            continue  # not well-typed on fewer rows or the cut: judged on more, the whole last
        if c is None:
            return (None if why is None else note + why), None
        return (None if why is None else f"on {c.describe()}: {why}"), c.describe()
    try:
        why = _validate(region, replacement, whole)
    except (TypeError, ValueError) as e:  # the replacement is not even well-typed here
        return f"the replacement cannot run on its region: {type(e).__name__}: {e}"[:300], None
    return (None if why is None else note + why), None


def _covered_cut(region: Region, replacement: Callable) -> tuple:
    """``(cut, note)``: the cut of the site's features to validate on, where every feature of
    the constants the rewrite ships is the rule's own on a cut (``feature_cut.coverage``), else
    None — the region is then validated whole, and ``note`` (prefixed to a refusal) says why
    where the constants differ."""
    cut = feature_cut.choose(region.site)
    if cut is None:
        return None, ""
    try:
        differs = feature_cut.coverage(region, replacement, cut)
    except Exception:  # not traceable or comparable on cuts (feature_cut.Mismatch,
        return None, ""  # Unshrinkable, a NumPy call on a tracer, ...): judged whole, never lost
    if differs is None:
        return cut, ""
    return None, f"{differs}; validated whole: "


def _narrow(region: Region) -> bool:
    """Some float of the region is narrower than float64 (else widening changes nothing)."""
    dtypes = [v.aval.dtype for v in region.inputs + region.outputs]
    dtypes += [c.dtype if hasattr(c, "dtype") else np.asarray(c).dtype
               for c in region.consts.values()]
    dtypes += [v.aval.dtype for e in region.eqns for v in e.outvars]
    return any(is_float(d) and np.dtype(d) != np.float64 for d in dtypes)


def _validate(region: Region, replacement: Callable, shapes: list, cut=None) -> str | None:
    floats = any(is_float(v.aval.dtype) for v in region.outputs)
    narrow = floats and _narrow(region)
    low = _low_precision(region) if narrow else None
    given = _given(region, with_removed=True, cut=cut)
    with shared_contractions.sharing():
        return _attempts(region, replacement, shapes, given, cut, floats, narrow, low)


def _attempts(region, replacement, shapes, given, cut, floats, narrow, low) -> str | None:
    with rebatch.cropping():
        if cut is None and COMPILED.get() != 0 and _compiled_pass(
                region, replacement, shapes, given, floats=floats, narrow=narrow, low=low):
            return None
    with rebatch.cropping():  # (each attempt's convs are its own)
        if _stacked_pass(region, replacement, shapes, given, cut, floats=floats, narrow=narrow,
                         low=low):
            return None
    with rebatch.cropping():
        return _validate_eagerly(region, replacement, shapes, given, cut, floats=floats,
                                 narrow=narrow, low=low)


def _compiled_pass(region: Region, replacement: Callable, shapes: list, given: dict, *,
                   floats: bool, narrow: bool, low) -> bool:
    """The region and its replacement compiled and run on every draw at once
    (``passes/validate_compiled.py``) pass every test of :func:`_validate_eagerly` but the other
    meanings of a removed constant; False — judged again eagerly, whose verdict and reason stand —
    where they do not, or cannot run so."""
    if not validate_compiled.worth_compiling(region, shapes, COMPILED.get()):
        validate_compiled.STATS["deferred"] += 1
        return False
    try:
        runs = validate_compiled.run(region, replacement, shapes, given, narrow=narrow,
                                     count=DRAWS, draw=draw, run_eqns=_run)
    except Unshrinkable:
        raise  # the same rebinding refuses it eagerly
    except validate_compiled.NotCompiled:
        validate_compiled.STATS["eager"] += 1
        return False
    return _every_draw_passes(runs, floats=floats, narrow=narrow, low=low)


def _every_draw_passes(runs: list, *, floats: bool, narrow: bool, low) -> bool:
    """``runs`` (per draw: the region's and the replacement's outputs in the program's dtypes,
    and in float64 where ``narrow``) pass every test of :func:`_validate_eagerly` but the other
    meanings of a removed constant (a failure is judged again draw by draw)."""
    for i, (before, after, before64, after64) in enumerate(runs):
        for k, (a, b) in enumerate(zip(before, after)):
            if a.shape != b.shape or (_finite(k, i, a, b) if is_float(a.dtype)
                                      else _exact(k, i, a, b)):
                return False
        if not floats:
            continue
        if not narrow:
            before64, after64 = before, after
        for k, (a, b, ap) in enumerate(zip(before64, after64, before)):
            if is_float(ap.dtype) and _close64(k, i, a.astype(np.float64),
                                               b.astype(np.float64), ap):
                return False
        if low is not None and i < DRAWS - 1 and any(
                is_float(ap.dtype) and _as_precise(k, i, r, ap, bp, low)
                for k, (r, ap, bp) in enumerate(zip(before64, before, after))):
            return False
    return True


def _stacked_pass(region: Region, replacement: Callable, shapes: list, given: dict, cut, *,
                  floats: bool, narrow: bool, low) -> bool:
    """Where the attempt runs one row along axis 0 of every input — cut to one from more than
    ``DRAWS``, or traced with one (a batch of one) — every draw at once, the draws stacked as
    rows there: each row computed alone and alike, as ``ir.rebatch`` binds rows (it refuses an
    equation that mixes them; an axis traced with one row grows inside ``rebatch.growing``).
    Each draw is judged on its own row, as :func:`_validate_eagerly` judges it. True only where
    every test passes; anything else (a failure, a refusal to bind, an output whose rows cannot
    be told apart) is judged again draw by draw, whose verdict and reason stand."""
    if cut is not None:
        shapes = [cut.shape(v, s) for v, s in zip(region.inputs, shapes)]
    grown = [len(s) > 0 and v.aval.shape[0] == 1 for s, v in zip(shapes, region.inputs)]
    if not shapes or any(len(s) == 0 or s[0] != 1 or 1 < v.aval.shape[0] <= DRAWS
                         for s, v in zip(shapes, region.inputs)) or len(set(grown)) != 1:
        return False  # (all grown or all cut: where the rows are in an output is then known)
    inputs = [np.concatenate([draw(s, v.aval.dtype, i) for i in range(DRAWS)])
              for s, v in zip(shapes, region.inputs)]
    grow = grown[0]
    try:
        with rebatch.growing() if grow else contextlib.nullcontext():
            with shared_contractions.twinning(floats and narrow):
                sides = [_evaluate(region, inputs, False, given, cut)]
            sides.append(_replaced(region, replacement, inputs, False, cut))
            if floats and narrow:
                with jax.enable_x64(True):
                    sides += [_evaluate(region, inputs, True, given, cut),
                              _replaced(region, replacement, inputs, True, cut)]
    except Exception:  # noqa: BLE001 — Unshrinkable, a replacement that fails: draw by draw
        return False
    axes = [_row_axis(v, x, grow) for v, x in zip(region.outputs, sides[0])]
    if any(a is None for a in axes) or any(
            np.shape(x) != np.shape(y) for side in sides[1:] for x, y in zip(sides[0], side)):
        return False
    if low is None and _every_row_passes(sides, axes, floats=floats, narrow=narrow):
        return True
    runs = [[[np.take(x, [i], axis=a) for x, a in zip(side, axes)] for side in sides]
            for i in range(DRAWS)]
    return _every_draw_passes([r + [None] * (4 - len(r)) for r in runs], floats=floats,
                              narrow=narrow, low=low)


def _every_row_passes(sides: list, axes: list, *, floats: bool, narrow: bool) -> bool:
    """:func:`_every_draw_passes` on the draws stacked as rows (each output's along its
    ``axes``), every draw at once: the same tests element by element, each draw's rms its own
    row's (taken a hair smaller: a pass here passes draw by draw too), the original's rounding
    share read only where the rest of the tolerance is exceeded. False where any test fails —
    judged again draw by draw, for the verdict and its reason."""
    for k, (a, b) in enumerate(zip(sides[0], sides[1])):
        if _finite(k, 0, a, b) if is_float(a.dtype) else not np.array_equal(a, b):
            return False
    if not floats:
        return True
    wide = sides[2:] if narrow else sides[:2]
    for a, b, ap, axis in zip(*wide, sides[0], axes):
        if not is_float(ap.dtype):
            continue
        a, b = (np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(DRAWS, -1)
                for x in (a, b))
        fa = np.isfinite(a)
        if not _nonfinite_alike(a, b, fa):
            return False
        finite = fa.all()
        kept = a if finite else np.where(fa, a, 0.0)
        count = a.shape[1] if finite else np.maximum(fa.sum(axis=1), 1)
        rms = np.sqrt(np.einsum("ij,ij->i", kept, kept) / count) * (1 - 1e-9)
        with np.errstate(invalid="ignore"):  # (Inf - Inf where both are Inf: masked)
            err = np.abs(a - b)
        if not finite:
            err = np.where(fa, err, 0.0)
        loose = RTOL_F64 * (np.abs(a) + rms[:, None])
        over = err > loose
        if over.any():  # the original's own rounding error there (as in _close64)
            prog = np.moveaxis(ap, axis, 0).reshape(DRAWS, -1)[over].astype(np.float64)
            own = np.where(np.isfinite(prog), np.abs(prog - a[over]), 0.0)
            if (err[over] > loose[over] + ROUNDING_SHARE * own).any():
                return False
    return True


def _row_axis(var, x, grown: bool = False) -> int | None:
    """The axis of output ``x`` (of ``var``, computed on ``DRAWS`` stacked rows) that holds the
    rows: the one axis where it is ``DRAWS`` long and ``var`` longer (``grown``: one long; a
    conv's crop may be ``DRAWS`` long too, but was never one); None where not one."""
    traced = tuple(getattr(var.aval, "shape", ()))
    found = [a for a, (n, m) in enumerate(zip(np.shape(x), traced))
             if n == DRAWS and (m == 1 if grown else m > DRAWS)]
    return found[0] if len(found) == 1 and np.ndim(x) == len(traced) else None


def _validate_eagerly(region: Region, replacement: Callable, shapes: list, given: dict, cut,
                      *, floats: bool, narrow: bool, low) -> str | None:
    """Each draw evaluated op by op (NumPy where it has the primitive, else XLA's kernels), in
    the program's dtypes and in float64: the verdict, and the measured reason of a refusal."""
    others = None  # the other meanings of a region on constants alone (below): once, if needed
    if cut is not None:
        shapes = [cut.shape(v, s) for v, s in zip(region.inputs, shapes)]
    for i in range(DRAWS):
        inputs = [draw(s, v.aval.dtype, i) for s, v in zip(shapes, region.inputs)]
        with shared_contractions.twinning(floats and narrow):
            before = _evaluate(region, inputs, False, given, cut)
        after = _replaced(region, replacement, inputs, False, cut)
        for k, (a, b) in enumerate(zip(before, after)):
            if a.shape != b.shape:  # (on a cut: a replacement that does not read it)
                raise ValueError(f"output {k} is {list(b.shape)}, the region's {list(a.shape)}")
            why = _finite(k, i, a, b) if is_float(a.dtype) else _exact(k, i, a, b)
            if why:
                return why
        if not floats:
            continue
        why = _compare64(region, replacement, inputs, before, after, given, narrow=narrow, i=i,
                         cut=cut, low=low if i < DRAWS - 1 else None)
        if why and narrow and _removes_a_constant(region, given):
            # Some equation the rewrite removes reads constants alone (a conv of a constant):
            # which of the constants it computes are the program's float32 values and which
            # their float64 values is a choice (_meanings), and a rewrite may make any of them.
            # Agreeing with one of them is agreeing.
            if others is None:
                others = _meanings(region, cut)
            for alt in others:
                why = why and _compare64(region, replacement, inputs, before, after, alt,
                                         narrow=narrow, i=i, cut=cut)
        if why:
            return why
    return None


def _removes_a_constant(region: Region, given: dict) -> bool:
    return any(id(e) in region.removed and all(v in given for v in e.outvars)
               for e in region.eqns)


def _meanings(region: Region, cut=None) -> list:
    """The float64 meanings of a region whose removed equations read constants alone, besides
    every constant in the program's dtype (see the module doc): the removed equations computed
    in float64 from the program's constants; and, where the region rewrites a linear site, its
    operand taken as an input — what the removed equations compute from it in float64, the
    constants they compute without it (a removed ``batch_norm`` call's rsqrt(var + eps)) in the
    program's dtype, as the rule reads them and as they are where the operand is an input."""
    out = [_given(region, with_removed=False, cut=cut)]
    operand = None if region.site is None else region.site.operand
    if operand is not None and type(operand) is not Literal:
        out.append(_given(region, with_removed=True, cut=cut, unknown=operand))
    return out


def _given(region: Region, with_removed: bool, cut=None, unknown=None) -> dict:
    """The values computed from constants alone (:func:`_constants`), from the program's
    constants: in the equations the rewrite removes too, or in the subgraphs they read only;
    the site's weights (and bias) as ``cut`` reads them. ``unknown``: a value the removed
    equations read as if it were an input (what they compute from it is not given)."""
    given = {v: np.asarray(c) for v, c in region.consts.items()}  # (no copy of a jax Array)
    kept = [e for e in region.eqns if id(e) not in region.removed]
    with eval_context():
        if not with_removed or unknown is None:
            _constants(region.eqns if with_removed else kept, given)
        else:  # the subgraphs first: the removed equations, then, without ``unknown``
            _constants(kept, given)
            held = given.pop(unknown, _UNKNOWN)
            _constants([e for e in region.eqns if id(e) in region.removed], given)
            if held is not _UNKNOWN:
                given[unknown] = held
    if cut is not None:
        for v in (cut.site.weight, cut.site.bias):
            if v is not None and v in given:
                given[v] = cut.constant(v, given[v])
    return given


def _compare64(region, replacement, inputs, before, after, given, *, narrow, i,
               cut=None, low=None) -> str | None:
    before64, after64 = before, after  # a float64 program: already what it means
    if narrow:
        with jax.enable_x64(True):
            before64 = _evaluate(region, inputs, True, given, cut)
            after64 = _replaced(region, replacement, inputs, True, cut)
    for k, (a, b, ap) in enumerate(zip(before64, after64, before)):
        if is_float(ap.dtype):
            why = _close64(k, i, a.astype(np.float64), b.astype(np.float64), ap)
            if why:
                return why
    if low is not None:
        for k, (r, ap, bp) in enumerate(zip(before64, before, after)):
            why = _as_precise(k, i, r, ap, bp, low) if is_float(ap.dtype) else None
            if why:
                return why
    return None


def _low_precision(region: Region) -> str | None:
    """The least precise float dtype of the region when it is less precise than float32
    (bfloat16, float16), else None: there a rewrite's own rounding is judged too."""
    dtypes = [v.aval.dtype for v in region.inputs + region.outputs]
    dtypes += [c.dtype if hasattr(c, "dtype") else np.asarray(c).dtype
               for c in region.consts.values()]
    dtypes += [v.aval.dtype for e in region.eqns for v in e.outvars]
    return narrow_dtype(coarsest(dtypes))


def _as_precise(k, i, r, a, b, low: str) -> str | None:
    """In a region that computes in ``low`` (bfloat16, float16): the replacement ``b``, in the
    program's dtypes, must be about as close to the float64 meaning ``r`` as the original ``a``
    is — within ``PRECISION_MARGIN`` times the original's own rounding error, over the output's
    largest element and its rms — or it loses precision (folded weights rounded to bfloat16
    where the original read them exactly and accumulated in float32). Measured, per output:
    never a blanket tolerance of that dtype."""
    r = np.asarray(r, np.float64)
    ok = np.isfinite(r) & np.isfinite(a.astype(np.float64)) & np.isfinite(b.astype(np.float64))
    if not ok.any():
        return None
    ea, eb = (np.abs(x.astype(np.float64)[ok] - r[ok]) for x in (a, b))
    tol = RTOL_F64 * (float(np.max(np.abs(r[ok]))) + float(np.sqrt(np.mean(np.square(r[ok])))))
    stats = [(float(np.max(e)), float(np.sqrt(np.mean(np.square(e))))) for e in (ea, eb)]
    if all(sb <= PRECISION_MARGIN * sa + tol for sa, sb in zip(*stats)):
        return None
    (max_a, rms_a), (max_b, rms_b) = stats
    return (f"loses precision in {low}: output {k} on input {i} is {rms_b:.3g} rms (max "
            f"{max_b:.3g}) from its float64 value, the original {rms_a:.3g} rms (max "
            f"{max_a:.3g}); a rewrite may round differently, not worse than "
            f"{PRECISION_MARGIN:g} × the original's own rounding")
