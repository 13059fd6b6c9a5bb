"""Exact, or why not: the pipeline against one device, teacher-forced, within calibrated noise.

On one device, at the same state and compiler settings as the pipeline, three computations of
the step: **A** the whole batch; **B** the mean over the pipeline's microbatches of each
microbatch's loss and gradients (a ``vmap``); **C** the same mean with each microbatch computed
on its own, one at a time from the last (a reversed ``lax.scan``), as a pipeline stage computes
them. B and C compute the same mathematics in other orders and fusions, so their difference is
rounding noise, whatever the loss (C summing B's values would measure the rounding of the sum
alone, narrower than what a stage's own compile of a microbatch rounds: docs/pipeline.md). A
equals B in exact arithmetic only if the loss is *separable* over microbatches: a loss that
mixes the examples of a batch (training BatchNorm's statistics, a mask drawn for the whole
batch) computes something else per microbatch, and the pipeline can only compute B.

So per step, from one device's state (teacher forcing): the loss is separable if A - B is within
the noise |B - C| (A - B in float64 when the model has a float64 twin: in float32 it is mostly
rounding, as large as the mathematics' difference may be small); the pipeline's loss and
gradients are then compared with A's (else with B's, and the report says why it is not exact),
each parameter leaf on its own, against ``NOISE_MARGIN`` x the measured noise (the largest
difference between any two of A, B, C and A64, the same step in float64 (:class:`Float64Twin`),
when separable; of B, C and B64 when not) plus ``FLOOR_EPS`` eps of the magnitude the sums add
up (the largest microbatch's loss or gradient). The new parameters are compared against what one
device's optimizer makes of gradients anywhere within that bound (each element moved by the
bound both ways) plus their own rounding. Separately, the pipeline's new parameters must equal
what optax makes of the pipeline's own gradients on one device, within ``FLOOR_EPS`` eps: the
optimizer ran on the whole tree.

A loss that draws random numbers (dropout) is judged against B alone, with noise from B, C and a
twin that draws the float32 program's bits (``stochastic.py``): A may draw other masks, and the
spread between two draws is never noise.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import x64_enabled
from mlsys_jax.ir.precision import ulp, widened
from mlsys_jax.parallel.shard.compare import (bound_ratio, holds_only, leaf_rms_diffs,
                                              leaf_rms_scales)
from mlsys_jax.parallel.shard.compare import leaf_diffs  # noqa: F401 (report.py's too)
from mlsys_jax.parallel.shard.compare import leaf_scales as leaf_magnitudes
from mlsys_jax.parallel.pipe.stochastic import draws_random, same_bits_widened


QUANTITIES = ("loss", "grads", "params")
NOISE_MARGIN = 4.0
RMS_MARGIN = 2.0
FLOOR_EPS = 4.0
_BATCH_STATS = re.compile(r"batch_stats|batchnorm|batch_norm", re.IGNORECASE)


def references(loss, groups: int, microbatch_loss=None, shared=()):
    """``f(trainable, batch) -> {A, B, C: (loss, grads), "terms": (loss, grads)}``; ``terms``
    holds the largest |loss| and, per leaf, |gradient| of a single microbatch (the scale of what
    the sums add). ``microbatch_loss`` (the loss on one microbatch, e.g. its traced jaxpr as a
    function: the user's Python is not traced again) serves B and C; ``shared``: per batch leaf,
    whether every microbatch reads it whole (one PRNG key, ``stochastic.shared_leaves``). The
    optimizer is applied to A, B and C by one separately compiled update."""
    vg, vg_mb = jax.value_and_grad(loss), jax.value_and_grad(microbatch_loss or loss)

    def f(t, batch):
        leaves, tree = jax.tree.flatten(batch)
        one = tuple(shared) or (False,) * len(leaves)
        mbs = [x.reshape((groups, x.shape[0] // groups) + x.shape[1:])
               for x, o in zip(leaves, one) if not o]

        def whole(rows):   # a microbatch's leaves: its rows, and the shared leaves whole
            it = iter(rows)
            return tree.unflatten([x if o else next(it) for x, o in zip(leaves, one)])
        bv, bg = jax.vmap(lambda rows: vg_mb(t, whole(rows)))(mbs)

        def body(acc, rows):  # one microbatch at a time, as a pipeline stage computes it
            return jax.tree.map(jnp.add, acc, vg_mb(t, whole(rows))), None
        a = vg(t, batch)
        total, _ = lax.scan(body, jax.tree.map(jnp.zeros_like, a), mbs, reverse=True)
        terms = (jnp.max(jnp.abs(bv)), jax.tree.map(lambda x: jnp.max(jnp.abs(x)), bg))
        return {"A": a, "B": (bv.mean(), jax.tree.map(lambda x: x.mean(0), bg)),
                "C": jax.tree.map(lambda x: x / groups, total), "terms": terms}
    return f


def _as64(tree):
    return jax.tree.map(lambda x: np.asarray(x, np.float64)
                        if jnp.issubdtype(jnp.result_type(x), jnp.floating) else x, tree)


class Float64Twin:
    """A, B and C in float64 (the user's code with float64 parameters and inputs, traced again;
    ``narrow``: the model computes in that dtype whatever its parameters' dtype, so its jaxpr is
    evaluated widened instead, every float in float64, ``ir.precision.widened``):
    how far one device's float32 results are from exact ones, and whether the loss is
    separable. A gradient that is mathematically zero (an attention key bias: softmax ignores a
    shift of every score) is pure rounding in float32, on one device and on the mesh alike; only
    this shows it. And float32's A - B mixes rounding (a whole batch's contraction against
    microbatch ones) with non-separability; float64's A - B is the non-separability alone.
    ``stochastic``: the loss draws random numbers, and the twin draws the float32 program's
    bits (``stochastic.same_bits_widened``), never float64's own."""

    def __init__(self, loss, trainable, batch, groups: int, options=None, narrow=None,
                 stochastic: bool = False, shared=()):
        self.fn, self.note, self.widened = None, None, False
        x64 = x64_enabled()   # the setting the program was traced under (its random draws')
        with jax.enable_x64(True):
            try:
                if stochastic:   # re-traced in float64 it would draw other bits (stochastic.py)
                    loss, self.widened = same_bits_widened(loss, trainable, batch, x64=x64), True
                elif narrow:   # bfloat16 arithmetic stays bfloat16 at float64 parameters
                    loss, self.widened = widened(loss, trainable, batch), True
                lowered = jax.jit(references(loss, groups, shared=shared)).lower(
                    _as64(trainable), _as64(batch))
                wide = all(jnp.dtype(a.dtype) == jnp.float64 for a in jax.tree.leaves(
                    lowered.out_info))
                self.fn = lowered.compile(options) if wide else None
                if not wide:
                    self.note = ("float64 twin unavailable: the model computes in float32 with "
                                 "float64 parameters; the noise is float32's alone")
            except Exception as e:  # the user's code may not run in float64
                self.note = (f"float64 twin unavailable ({type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0][:80] if str(e).strip() else ''})"
                             f"; the noise is {narrow or 'float32'}'s alone")

    def __call__(self, trainable, batch) -> dict | None:
        """``{"A64": .., "B64": ..}``, each ``{"loss", "grads"}``; None without a twin."""
        if self.fn is None:
            return None
        with jax.enable_x64(True):
            out = jax.device_get(self.fn(_as64(trainable), _as64(batch)))
        return {f"{k}64": {"loss": out[k][0], "grads": out[k][1]} for k in "AB"}


def leaf_bounds(noise, scale, like, narrow=()) -> list[float]:
    """``NOISE_MARGIN`` x noise + ``FLOOR_EPS`` eps x scale, per leaf (eps of ``like``'s dtype;
    at most float32's for a leaf ``narrow`` names: that dtype's rounding is measured)."""
    out = []
    narrow = list(narrow) + [None] * len(noise)
    for n, m, r, low in zip(noise, scale, jax.tree.leaves(like), narrow):
        dtype = np.asarray(r).dtype
        eps = float(jnp.finfo(dtype).eps) if jnp.issubdtype(dtype, jnp.inexact) else 0.0
        if low:
            eps = min(eps, float(jnp.finfo(jnp.float32).eps))
        out.append(NOISE_MARGIN * n + FLOOR_EPS * eps * m)
    return out


class PipelineVerdict:
    """Accumulates, step by step, the worst difference / bound per quantity."""

    def __init__(self):
        self.worst = {q: {"diff": 0.0, "noise": 0.0, "bound": 0.0, "ratio": 0.0}
                      for q in QUANTITIES + ("separability", "optimizer")}
        self.separable_steps: list[bool] = []

    def record(self, what: str, diffs, noise, bounds) -> None:
        """Keep the worst difference-to-bound ratio seen so far for ``what``."""
        for d, n, b in zip(diffs, noise, bounds):
            ratio = bound_ratio(d, b)
            if ratio >= self.worst[what]["ratio"]:
                self.worst[what] = {"diff": d, "noise": n, "bound": b, "ratio": ratio}

    def within(self, what: str) -> bool:
        """Whether every difference recorded for ``what`` stayed within its noise bound."""
        return self.worst[what]["ratio"] <= 1.0


@dataclass(frozen=True)
class NarrowLeaves:
    """The leaves whose computation passes through a dtype less precise than float32
    (``ir.precision.gradient_dtypes``: ``loss``, ``grads``, each a dtype name per leaf or None)
    and how many partial results a gradient element sums (``reductions``: data x microbatches).
    Such a leaf's noise leaves out the float64 twin (its distance from exact arithmetic is the
    whole of the model's bfloat16 rounding, which the pipeline shares), its bound adds
    ``reductions`` units in the last place of that dtype at the largest microbatch term (each
    partial result rounded once, where the whole batch's result holds that dtype's numbers),
    and the rms over the leaf is held to the same rule: a gradient scaled by 1.01 moves every
    element by a bfloat16 ulp or two, as rounding moves a few."""

    loss: tuple
    grads: tuple
    reductions: int = 1

    def dtypes(self, q: str) -> tuple:
        return {"loss": self.loss, "grads": self.grads}[q]


def _allowance(narrow, q: str, terms: list, whole) -> list:
    """Per leaf: ``reductions`` ulps of its narrow dtype at its largest microbatch term, where
    the whole batch's result holds only that dtype's numbers; 0 elsewhere."""
    if narrow is None:
        return [0.0] * len(terms)
    return [narrow.reductions * ulp(d, m) if d and holds_only(x, d) else 0.0
            for d, m, x in zip(narrow.dtypes(q), terms, jax.tree.leaves(whole))]


def _pairwise(trees: list, diffs=leaf_diffs) -> list:
    """Per leaf, the largest difference between any two of ``trees``."""
    return [max(d) for d in zip(*(diffs(x, y) for i, x in enumerate(trees)
                                  for y in trees[i + 1:]))]


def judge_step(verdict: PipelineVerdict, refs: dict, got: dict, own_update,
               narrow: NarrowLeaves | None = None, *, stochastic: bool = False) -> bool:
    """Record one teacher-forced step (``refs[k]``: loss, grads, params, opt_state of the
    one-device computations A, B, C; ``refs["terms"]``: their scale; ``refs["A64"]`` and
    ``refs["B64"]``, if there is a float64 twin: its loss and gradients); ``own_update(grads)``
    is the one-device optimizer's new parameters from the step's state; ``narrow``: the leaves
    computed in bfloat16 or float16 (:class:`NarrowLeaves`); ``stochastic``: the loss draws
    random numbers, so only the microbatched B, C (and B64) are known to draw the pipeline's
    bits: the reference is B and the noise leaves A out, separable or not (a spread between
    two draws is no rounding noise; ``stochastic.py``). Returns whether the loss was
    separable."""
    A, B, C = (dict(zip(("loss", "grads", "params", "opt_state"), refs[k])) for k in "ABC")
    scale = {"loss": leaf_magnitudes(refs["terms"][0]),
             "grads": leaf_magnitudes(refs["terms"][1])}
    extra = {q: _allowance(narrow, q, scale[q], A[q]) for q in ("loss", "grads")}
    noise_bc = {q: leaf_diffs(B[q], C[q]) for q in QUANTITIES}
    ab = {q: leaf_diffs(A[q], B[q]) for q in ("loss", "grads")}
    low = {q: narrow.dtypes(q) if narrow is not None else () for q in ab}
    sep_bounds = {q: [b + e for b, e in zip(leaf_bounds(noise_bc[q], scale[q], B[q], low[q]),
                                            extra[q])] for q in ab}
    if "B64" in refs:  # the mathematics' own A - B, against what float32 could distinguish
        ab = {q: leaf_diffs(refs["A64"][q], refs["B64"][q]) for q in ab}
    separable = all(d <= b for q in ab for d, b in zip(ab[q], sep_bounds[q]))
    for q in ab:
        verdict.record("separability", ab[q], noise_bc[q], sep_bounds[q])
    whole = separable and not stochastic   # A draws the pipeline's bits only if separable
    ref = A if whole else B
    bounds = {}
    for q in ("loss", "grads"):
        # the noise: the largest difference between any two equivalent one-device computations
        # of what the pipeline computes (A, B, C and the twin's A64 = B64 when separable; B, C
        # and B64 when not): float64's are how far each float32 result is from the exact one
        same = [B[q], C[q]] + ([A[q]] if whole else [])
        noise = _pairwise(same + ([refs["A64" if whole else "B64"][q]] if "B64" in refs
                                  else []))
        if narrow is not None:   # (a narrow leaf's distance from float64 is not noise)
            noise = [n if not d else m for n, m, d in zip(noise, _pairwise(same),
                                                          narrow.dtypes(q))]
        bounds[q] = [b + e for b, e in zip(leaf_bounds(noise, scale[q], ref[q], low[q]),
                                           extra[q])]
        verdict.record(q, leaf_diffs(got[q], ref[q]), noise, bounds[q])
        if narrow is not None:
            _record_rms(verdict, q, got[q], ref[q], same, scale[q], narrow)
    _judge_params(verdict, ref, got, own_update, bounds["grads"])
    verdict.separable_steps.append(separable)
    return separable


def _record_rms(verdict, q: str, got, ref, same: list, scale: list, narrow) -> None:
    """The narrow leaves' rms of got - ref against ``RMS_MARGIN`` x the rms noise, the floor,
    and the allowance at the leaf's rms magnitude as if at one element alone. (An rms over a
    leaf is a steady statistic, unlike its max, which one lucky element sets: twice the noise,
    as ``shard``'s rule.)"""
    sizes = [int(np.size(x)) for x in jax.tree.leaves(ref)]
    noise = _pairwise(same, leaf_rms_diffs)
    floor = leaf_bounds([0.0] * len(noise), scale, ref, narrow.dtypes(q))
    extra = _allowance(narrow, q, leaf_rms_scales(ref), ref)
    bounds = [RMS_MARGIN * n + f + e / np.sqrt(max(k, 1))
              for n, f, e, k in zip(noise, floor, extra, sizes)]
    keep = [i for i, d in enumerate(narrow.dtypes(q)) if d]
    diffs = leaf_rms_diffs(got, ref)
    verdict.record(q, [diffs[i] for i in keep], [noise[i] for i in keep], [bounds[i] for i in keep])


def _judge_params(verdict, ref: dict, got: dict, own_update, grad_bounds: list) -> None:
    """New parameters: what the optimizer makes of gradients anywhere within their bound (per
    element, both ways: Adam divides a gradient by its own magnitude, so a gradient that is
    rounding noise moves its parameter by up to the learning rate), plus their own rounding;
    and what optax makes of the pipeline's own gradients (the optimizer ran on the whole
    tree)."""
    spread = [0.0] * len(grad_bounds)
    for sign in (1.0, -1.0):
        shifted = jax.tree.unflatten(jax.tree.structure(ref["grads"]), [
            np.asarray(g + sign * b, np.asarray(g).dtype)
            for g, b in zip(jax.tree.leaves(ref["grads"]), grad_bounds)])
        spread = [max(x, y) for x, y in zip(spread, leaf_diffs(own_update(shifted),
                                                                ref["params"]))]
    floor = leaf_bounds([0.0] * len(spread), leaf_magnitudes(ref["params"]), ref["params"])
    verdict.record("params", leaf_diffs(got["params"], ref["params"]), spread,
                   [x + y for x, y in zip(spread, floor)])
    mine = own_update(got["grads"])
    zero = [0.0] * len(jax.tree.leaves(mine))
    verdict.record("optimizer", leaf_diffs(got["params"], mine), zero,
                   leaf_bounds(zero, leaf_magnitudes(mine), mine))


def causes(closed, paths) -> list[str]:
    """Why a loss may mix the examples of a batch, read from its jaxpr and parameter names."""
    out = []
    if draws_random(closed):
        out.append("the loss draws its random numbers (e.g. dropout) for the whole batch at "
                   "once, from a key fixed inside it or one key of the batch: a microbatch "
                   "draws other masks than its rows get in the whole batch")
    stats = [jax.tree_util.keystr(p) for p in paths if _BATCH_STATS.search(
        jax.tree_util.keystr(p))]
    if stats:
        out.append(f"batch statistics (training-mode BatchNorm: {stats[0]}): each microbatch "
                   "normalises by its own mean and variance")
    return out or ["no cause found in the loss (no random draw, no parameter named as batch "
                   "statistics): the whole batch and its microbatches differ beyond the "
                   "measured rounding noise"]
