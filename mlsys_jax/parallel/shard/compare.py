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
A NaN or Inf that one side holds and the other does not is an Inf difference, never a NaN that a
later ``max`` could drop (whichever leaf it is in); the same NaN or Inf on both sides is none
(:func:`_blocks`).

A leaf whose computation passes through bfloat16 or float16 (``ir.precision``) rounds as that
dtype does: its noise is measured in that arithmetic (``semantics.Arrangement``) and its bound
(:class:`Narrow`, :func:`_narrow_rule`) adds one unit in the last place of that dtype per device
at the leaf's largest magnitude, where the leaf holds only that dtype's numbers, and holds the
rms over the leaf to the same rule — a gradient scaled by 1.01 is one or two bfloat16 ulps at
every element, which the largest element alone cannot tell from rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np

FLOOR_EPS = 16
EPS32 = float(np.finfo(np.float32).eps)
BLOCK = 1 << 16   # elements compared at a time (a float64 block of 512 KiB stays in cache):
#                   never a float64 copy of a leaf


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


def _blocks(a: np.ndarray, b: np.ndarray | None):
    """``a - b`` (``a`` without ``b``) in float64, BLOCK elements at a time, each block written
    into one reused buffer: no temporary per block (a fresh float64 block per step is a page
    fault per 4 KiB where large blocks are mapped on their own, ``step.map_large_blocks``).
    Non-finite elements never make a NaN: where both sides hold the same non-finite value (NaN
    and NaN, +Inf and +Inf) the difference is 0, where one does and the other does not it is
    Inf — so no later ``max`` can lose it. Without ``b``: ``a``'s finite elements only (a
    magnitude to scale a floor by; non-finite elements are compared exactly)."""
    a = a.reshape(-1)
    b = None if b is None else b.reshape(-1)
    buffer = np.empty(min(BLOCK, a.size), np.float64)
    for i in range(0, a.size, BLOCK):
        d = buffer[:min(BLOCK, a.size - i)]
        if b is None:
            d[...] = a[i:i + d.size]
            finite = np.isfinite(d)
            if not finite.all():
                d = d[finite]
        else:
            with np.errstate(invalid="ignore"):  # Inf - Inf: a NaN, settled below
                np.subtract(a[i:i + d.size], b[i:i + d.size], out=d, dtype=np.float64)
            nan = np.isnan(d)
            if nan.any():
                x, y = a[i:i + d.size][nan], b[i:i + d.size][nan]
                d[nan] = np.where((x == y) | (np.isnan(x) & np.isnan(y)), 0.0, np.inf)
        yield d


def _blockwise_max(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """max |a - b| (max |a| without ``b``) in float64, block by block, as :func:`_blocks`
    reads non-finite elements: never NaN."""
    worst = 0.0
    for d in _blocks(a, b):
        worst = max(worst, float(np.max(np.abs(d, out=d), initial=0.0)))
    return worst


def _max_abs_diff(u, v) -> float:
    if np.shape(u) != np.shape(v) or _spans_processes(u) or _spans_processes(v):
        return _blockwise_max(host(u), host(v))
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


def _blockwise_sumsq(a: np.ndarray, b: np.ndarray | None = None) -> float:
    """sum (a - b)² (sum a² without ``b``) in float64, block by block."""
    return float(sum(np.dot(d, d) for d in _blocks(a, b)))


def _rms_diff(u, v) -> float:
    size = int(np.size(u))
    if size == 0:
        return 0.0
    if np.shape(u) != np.shape(v) or _spans_processes(u) or _spans_processes(v):
        return float(np.sqrt(np.mean(np.square(host(u) - host(v)))))
    if _sharded(v) and not _sharded(u):
        u, v = v, u
    whole = np.asarray(v)
    total = sum(_blockwise_sumsq(piece, whole[index]) for index, piece in _pieces(u))
    return float(np.sqrt(total / size))


def leaf_rms_diffs(a, b) -> list[float]:
    """The root mean square of a - b for each pair of leaves, as :func:`leaf_diffs` reads them."""
    return [_rms_diff(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))]


def leaf_rms_scales(a) -> list[float]:
    """The root mean square of each leaf's elements."""
    out = []
    for u in jax.tree.leaves(a):
        pieces = [((), host(u))] if _spans_processes(u) else _pieces(u)
        total = sum(_blockwise_sumsq(p) for _, p in pieces)
        out.append(float(np.sqrt(total / max(int(np.size(u)), 1))))
    return out


def holds_only(x, dtype) -> bool:
    """Every element of ``x`` is a number of ``dtype`` (a float32 array converted from bfloat16
    is): its last rounding was that dtype's."""
    for _, piece in _pieces(host(x) if _spans_processes(x) else x):
        flat = piece.reshape(-1)
        for i in range(0, flat.size, BLOCK):
            block = flat[i:i + BLOCK]
            if not np.array_equal(block, block.astype(dtype).astype(block.dtype), equal_nan=True):
                return False
    return True


def leaf_scales(a) -> list[float]:
    """max |a| for each leaf, as :func:`leaf_diffs` computes."""
    out = []
    for u in jax.tree.leaves(a):
        if _spans_processes(u):
            out.append(_blockwise_max(host(u)))
        else:
            out.append(max((_blockwise_max(p) for _, p in _pieces(u)), default=0.0))
    return out


@dataclass
class Narrow:
    """One step's leaves whose computation passes through a float dtype less precise than
    float32 (bfloat16, float16): what the rule for them reads (see :class:`Judgement`)."""

    dtypes: list            # per leaf: that dtype's name, or None (the plain rule)
    rms_diffs: list         # per leaf: rms of result - reference
    rms_noises: list        # per leaf: rms of reference - its equivalent computations (largest)
    sizes: list             # per leaf: its element count
    ulps: list              # per leaf: one unit in the last place of that dtype at the leaf's
    #                         largest magnitude, where the leaf holds that dtype's numbers only
    #                         (its last rounding was that dtype's), else 0
    rms_ulps: list          # the same at the leaf's rms magnitude
    reductions: int = 1     # partial results the mesh adds up per element (its device count)


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
    dtype: str | None = None  # the dtype that leaf's rounding comes from (narrower than float32)
    rule: str = "max"        # which statistic that leaf was judged by nearest its bound
    narrow: set = field(default_factory=set)   # every such dtype seen
    ulps: float = 0.0        # the most units in the last place a bound allowed
    reductions: int = 1

    @property
    def within(self) -> bool:
        return self.ratio <= 1.0

    def add(self, diffs: list, noises: list, scales: list, eps: float,
            narrow: Narrow | None = None) -> None:
        """Fold one step's leafwise figures in (``narrow``: the leaves that compute in a dtype
        less precise than float32, judged by the rule of the module doc)."""
        self.scale = max(self.scale, max(scales, default=0.0))
        for i, (d, n) in enumerate(zip(diffs, noises)):
            dtype = narrow.dtypes[i] if narrow is not None else None
            if dtype:
                self.narrow.add(dtype)
                self.ulps = max(self.ulps, narrow.ulps[i])
                self.reductions = narrow.reductions
                rule, d, bound = _narrow_rule(i, d, n, FLOOR_EPS * min(eps, EPS32) * self.scale,
                                              narrow)
            else:
                rule, bound = "max", 2.0 * n + FLOOR_EPS * eps * self.scale
            ratio = bound_ratio(d, bound)
            if self.worst is None or ratio > self.ratio:
                self.worst, self.ratio, self.bound, self.at_worst = i, float(ratio), bound, d
                self.dtype, self.rule = dtype, rule
        self.diff = max(self.diff, max(diffs, default=0.0))
        self.noise = max(self.noise, max(noises, default=0.0))

    def as_json(self) -> dict:
        return {"diff": self.diff, "noise": self.noise, "bound": self.bound, "scale": self.scale}


def bound_ratio(d: float, bound: float) -> float:
    """``d / bound``: at most 1 is within the bound; a NaN (of either) or an Inf difference is
    never within (Inf / Inf neither), a zero bound only holds a zero difference."""
    if d != d or bound != bound or d == np.inf:
        return float(np.inf)
    return d / bound if bound > 0 else (0.0 if d == 0 else float(np.inf))


def _narrow_rule(i: int, d: float, noise: float, floor: float, narrow: Narrow) -> tuple:
    """``(rule, figure, bound)`` of leaf ``i`` computed in a narrow dtype: the statistic (max or
    rms over the leaf) nearer its bound. The max's bound adds ``reductions`` units in the last
    place at the leaf's largest magnitude (each device's partial result rounded once in that
    dtype, where the leaf holds only its numbers); the rms's adds them at the leaf's rms
    magnitude as if at one element alone. float32's floor: the narrow dtype's own rounding is
    measured, not assumed."""
    allowance = narrow.reductions * narrow.ulps[i]
    bound = 2.0 * noise + floor + allowance
    rd = narrow.rms_diffs[i]
    rb = (2.0 * narrow.rms_noises[i] + floor
          + narrow.reductions * narrow.rms_ulps[i] / np.sqrt(max(narrow.sizes[i], 1)))
    if bound_ratio(rd, rb) > bound_ratio(d, bound):
        return "rms", rd, rb
    return "max", d, bound
