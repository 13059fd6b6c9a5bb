"""Exact, or why not: the pipeline against one device, teacher-forced, within calibrated noise.

On one device, at the same state and compiler settings as the pipeline, three computations of
the step: **A** the whole batch; **B** the mean over the pipeline's microbatches of each
microbatch's loss (a ``vmap``); **C** the same as B in a ``lax.scan`` loop. B and C compute
the same thing in two ways, so their difference is rounding noise, whatever the loss. A equals
B in exact arithmetic only if the loss is *separable* over microbatches: a loss that mixes the
examples of a batch (training BatchNorm's statistics, a mask drawn for the whole batch)
computes something else per microbatch, and the pipeline can only compute B.

So per step, from one device's state (teacher forcing): the loss is separable if A - B is within
the noise; the pipeline's loss, gradients and new parameters are then compared with A's (else
with B's, and the report says why it is not exact), each parameter leaf on its own, against
``NOISE_MARGIN`` x the measured noise (max(|A - B|, |B - C|) when separable, |B - C| when not)
plus ``FLOOR_EPS`` eps of the leaf's magnitude (where both computations happen to round alike).
Separately, the pipeline's new parameters must equal what optax makes of the pipeline's own
gradients on one device, within ``FLOOR_EPS`` eps: the optimizer ran on the whole tree.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


QUANTITIES = ("loss", "grads", "params")
NOISE_MARGIN = 4.0
FLOOR_EPS = 4.0
RANDOM_PRIMITIVES = ("random_bits", "threefry2x32")
_BATCH_STATS = re.compile(r"batch_stats|batchnorm|batch_norm", re.IGNORECASE)


def references(loss, groups: int):
    """``f(trainable, batch) -> {A, B, C: (loss, grads)}`` (the optimizer is applied to each
    by one separately compiled update)."""
    vg = jax.value_and_grad(loss)

    def f(t, batch):
        mbs = jax.tree.map(lambda x: x.reshape((groups, x.shape[0] // groups) + x.shape[1:]),
                           batch)
        bv, bg = jax.vmap(vg, in_axes=(None, 0))(t, mbs)

        def body(acc, mb):
            return jax.tree.map(jnp.add, acc, vg(t, mb)), None
        a = vg(t, batch)
        total, _ = lax.scan(body, jax.tree.map(jnp.zeros_like, a), mbs)
        return {"A": a, "B": (bv.mean(), jax.tree.map(lambda x: x.mean(0), bg)),
                "C": jax.tree.map(lambda x: x / groups, total)}
    return f


def leaf_diffs(a, b) -> list[float]:
    return [float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)),
                         initial=0.0)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]


def leaf_bounds(noise, ref) -> list[float]:
    out = []
    for n, r in zip(noise, jax.tree.leaves(ref)):
        r = np.asarray(r)
        eps = float(jnp.finfo(r.dtype).eps) if jnp.issubdtype(r.dtype, jnp.inexact) else 0.0
        out.append(NOISE_MARGIN * n + FLOOR_EPS * eps * float(np.max(np.abs(r), initial=0.0)))
    return out


class Verdict:
    """Accumulates, step by step, the worst difference / bound per quantity."""

    def __init__(self):
        self.worst = {q: {"diff": 0.0, "noise": 0.0, "bound": 0.0, "ratio": 0.0}
                      for q in QUANTITIES + ("separability", "optimizer")}
        self.separable_steps: list[bool] = []

    def record(self, what: str, diffs, noise, bounds) -> None:
        for d, n, b in zip(diffs, noise, bounds):
            ratio = d / b if b > 0 else (0.0 if d == 0 else float("inf"))
            if ratio >= self.worst[what]["ratio"]:
                self.worst[what] = {"diff": d, "noise": n, "bound": b, "ratio": ratio}

    def within(self, what: str) -> bool:
        return self.worst[what]["ratio"] <= 1.0


def judge_step(verdict: Verdict, refs: dict, got: dict, own_update) -> bool:
    """Record one teacher-forced step (``refs[k]``: loss, grads, params, opt_state of the
    one-device computations A, B, C); returns whether the loss was separable at it."""
    A, B, C = (dict(zip(("loss", "grads", "params", "opt_state"), refs[k])) for k in "ABC")
    noise_bc = {q: leaf_diffs(B[q], C[q]) for q in QUANTITIES}
    ab = {q: leaf_diffs(A[q], B[q]) for q in ("loss", "grads")}
    sep_bounds = {q: leaf_bounds(noise_bc[q], B[q]) for q in ab}
    separable = all(d <= b for q in ab for d, b in zip(ab[q], sep_bounds[q]))
    for q in ab:
        verdict.record("separability", ab[q], noise_bc[q], sep_bounds[q])
    ref = A if separable else B
    for q in QUANTITIES:
        noise = noise_bc[q]
        if separable:
            noise = [max(x, y) for x, y in zip(noise, leaf_diffs(A[q], B[q]))]
        verdict.record(q, leaf_diffs(got[q], ref[q]), noise, leaf_bounds(noise, ref[q]))
    mine = own_update(got["grads"])
    zero = [0.0] * len(jax.tree.leaves(mine))
    verdict.record("optimizer", leaf_diffs(got["params"], mine), zero,
                   leaf_bounds(zero, mine))
    verdict.separable_steps.append(separable)
    return separable


def causes(closed, paths) -> list[str]:
    """Why a loss may mix the examples of a batch, read from its jaxpr and parameter names."""
    from mlsys_jax.ir import primitive_counts

    prims, out = primitive_counts(closed), []
    if any(p in prims for p in RANDOM_PRIMITIVES):
        out.append("the loss draws random numbers from a key fixed inside it (e.g. dropout): "
                   "every microbatch draws the mask for its own rows from that same key")
    stats = [jax.tree_util.keystr(p) for p in paths if _BATCH_STATS.search(
        jax.tree_util.keystr(p))]
    if stats:
        out.append(f"batch statistics (training-mode BatchNorm: {stats[0]}): each microbatch "
                   "normalises by its own mean and variance")
    return out or ["the loss couples the examples of a batch (a batch statistic or a "
                   "normalisation by the batch): each microbatch computes it on its own rows"]
