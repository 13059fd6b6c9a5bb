"""Comparing two computations of the same quantity against the noise of equivalent ones.

Splitting a batch over devices reorders sums, so a mesh's gradients equal one device's only up to
float rounding — and how much rounding depends on the model (BatchNorm over a few rows amplifies
it by orders of magnitude). So the yardstick is measured: two *equivalent* one-device computations
of the same mathematics (the whole batch and the mean of per-shard losses; per-shard losses in two
shard orders) differ by some noise, leaf by leaf, and a result is called different only when it is
beyond that noise: ``|Δ| > 2 · noise + FLOOR_EPS · eps · scale`` for some leaf, ``scale`` being the
largest magnitude of the quantity over all leaves. The floor covers equivalent computations that
happen to round identically (then the noise reads zero): splitting only reorders sums, and
reordered float32 sums of these models differ by a few eps of the largest magnitude.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

FLOOR_EPS = 16


def host(x) -> np.ndarray:
    """A NumPy float64 copy of one array (gathered when it spans several processes)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x, np.float64)


def leaf_diffs(a, b) -> list[float]:
    """max |a - b| for each pair of leaves of two pytrees of the same structure."""
    out = []
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        out.append(float(np.max(np.abs(host(u) - host(v)), initial=0.0)))
    return out


def leaf_scales(a) -> list[float]:
    return [float(np.max(np.abs(host(u)), initial=0.0)) for u in jax.tree.leaves(a)]


@dataclass
class Judgement:
    """One quantity (loss, gradients or parameters) of a run, against its reference."""

    diff: float = 0.0        # max over leaves (and steps) of |result - reference|
    noise: float = 0.0       # max over leaves of |reference - equivalent computation|
    scale: float = 0.0       # max |reference|
    bound: float = 0.0       # the bound at the leaf closest to (or furthest past) its bound
    worst: int | None = None  # that leaf's index
    at_worst: float = 0.0    # its |result - reference|
    ratio: float = 0.0       # its diff / bound

    @property
    def within(self) -> bool:
        return self.ratio <= 1.0

    def add(self, diffs: list, noises: list, scales: list, eps: float) -> None:
        """Fold one step's leafwise figures in."""
        self.scale = max(self.scale, max(scales, default=0.0))
        floor = FLOOR_EPS * eps * self.scale
        for i, (d, n) in enumerate(zip(diffs, noises)):
            bound = 2.0 * n + floor
            ratio = d / bound if bound > 0 else (0.0 if d == 0 else np.inf)
            if self.worst is None or ratio > self.ratio:
                self.worst, self.ratio, self.bound, self.at_worst = i, float(ratio), bound, d
        self.diff = max(self.diff, max(diffs, default=0.0))
        self.noise = max(self.noise, max(noises, default=0.0))

    def as_json(self) -> dict:
        return {"diff": self.diff, "noise": self.noise, "bound": self.bound, "scale": self.scale}
