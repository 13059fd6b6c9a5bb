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
BLOCK = 1 << 20   # elements compared at a time: float64 copies of a block, never of a leaf


def _spans_processes(x) -> bool:
    return isinstance(x, jax.Array) and not x.is_fully_addressable


def host(x) -> np.ndarray:
    """A NumPy float64 copy of one array (gathered when it spans several processes)."""
    if _spans_processes(x):
        from jax.experimental import multihost_utils

        x = multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x, np.float64)


def _sharded(x) -> bool:
    return isinstance(x, jax.Array) and len(x.sharding.device_set) > 1


def _pieces(x):
    """``(index, view)`` for each distinct shard of an array of this process (one replica of a
    replicated one), each a host view of the shard's own buffer: no copy of the whole array is
    assembled (NumPy's conversion of a sharded array builds one and keeps it on the array)."""
    if _sharded(x):
        for s in x.addressable_shards:
            if s.replica_id == 0:
                yield s.index, np.asarray(s.data)
    else:
        yield (), np.asarray(x)


def _blockwise_max(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """max |a - b| (max |a| without ``b``) in float64, BLOCK elements at a time; NaN if any."""
    a = a.reshape(-1)
    b = None if b is None else b.reshape(-1)
    worst = np.float64(0.0)
    for i in range(0, a.size, BLOCK):
        d = a[i:i + BLOCK].astype(np.float64)
        if b is not None:
            d -= b[i:i + BLOCK]
        worst = np.maximum(worst, np.max(np.abs(d), initial=0.0))
    return float(worst)


def _max_abs_diff(u, v) -> float:
    if np.shape(u) != np.shape(v) or _spans_processes(u) or _spans_processes(v):
        return float(np.max(np.abs(host(u) - host(v)), initial=0.0))
    if _sharded(v) and not _sharded(u):
        u, v = v, u
    whole = np.asarray(v)      # one device's array: on the CPU a view of its buffer, no copy
    worst = 0.0
    for index, piece in _pieces(u):
        worst = np.maximum(worst, _blockwise_max(piece, whole[index]))
    return float(worst)


def leaf_diffs(a, b) -> list[float]:
    """max |a - b| for each pair of leaves of two pytrees of the same structure, computed in
    float64 shard by shard and block by block: the comparison holds no host copy of a leaf."""
    return [_max_abs_diff(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))]


def leaf_scales(a) -> list[float]:
    """max |a| for each leaf, as :func:`leaf_diffs` computes."""
    out = []
    for u in jax.tree.leaves(a):
        if _spans_processes(u):
            out.append(float(np.max(np.abs(host(u)), initial=0.0)))
        else:
            out.append(float(np.max([_blockwise_max(p) for _, p in _pieces(u)], initial=0.0)))
    return out


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
