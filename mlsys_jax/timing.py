"""Side-by-side timing: median of repeats after warm-up, with min–max, and ratios between them.

On a shared, noisy machine an absolute time means little; a ratio of two medians measured in the
same run, with the candidates interleaved repeat by repeat (so a burst of load hits all of them),
is what the experiments and benchmarks report. Every callable's result is waited for with
``jax.block_until_ready`` (JAX dispatches asynchronously).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import jax

from mlsys_jax.errors import MlsysError


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median, min and max over ``repeats`` repeats of ``number`` calls each."""

    median_s: float
    min_s: float
    max_s: float
    repeats: int
    number: int
    samples: tuple = ()  # seconds per call in each round, in round order (for paired ratios)

    @property
    def median_us(self) -> float:
        return self.median_s * 1e6

    def to_dict(self) -> dict:
        return {"median_us": self.median_s * 1e6, "min_us": self.min_s * 1e6,
                "max_us": self.max_s * 1e6, "repeats": self.repeats, "number": self.number}

    def summary(self) -> str:
        """``median [min–max] µs`` for notes and tables."""
        return f"{self.median_s * 1e6:.4g} [{self.min_s * 1e6:.3g}–{self.max_s * 1e6:.3g}] µs"


@dataclass(frozen=True)
class Ratio:
    """``a / b`` of two timings: the ratio of medians, and the extreme ratios of their ranges."""

    median: float
    low: float
    high: float

    def to_dict(self) -> dict:
        return {"ratio": self.median, "min": self.low, "max": self.high}


def ratio(a: Timing, b: Timing) -> Ratio:
    """How many times slower ``a`` is than ``b``.

    When both come from one :func:`compare` call, the ratio is *paired*: the median over rounds of
    ``a``'s time over ``b``'s time in the same round, so load that comes and goes on a shared
    machine cancels (min–max over rounds). Otherwise: the ratio of medians, with the extreme
    ratios of the two ranges as min–max.
    """
    if a.samples and len(a.samples) == len(b.samples):
        per_round = [x / y for x, y in zip(a.samples, b.samples)]
        return Ratio(statistics.median(per_round), min(per_round), max(per_round))
    return Ratio(a.median_s / b.median_s, a.min_s / b.max_s, a.max_s / b.min_s)


def _run(fn: Callable[[], Any], number: int, clock: Callable[[], float] = time.perf_counter
         ) -> float:
    out = None
    t0 = clock()
    for _ in range(number):
        out = fn()
    jax.block_until_ready(out)
    return clock() - t0


def _calibrate(fn: Callable[[], Any], min_time_s: float, max_number: int,
               per_call_s: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls per round so that a round takes at least ``min_time_s`` (like timeit.autorange).

    Starts from half the count that ``per_call_s`` (a warm call, if known) suggests. The best of
    three trials decides: one trial stalled by another process must not leave the rounds too
    short (short rounds are dominated by the wait for the result, not the calls).
    """
    number = min(max_number, max(1, int(0.5 * min_time_s / per_call_s))) if per_call_s > 0 else 1
    while number < max_number:
        best = min(_run(fn, number, clock) for _ in range(3))
        if best >= min_time_s:
            break
        # jump towards the target at the measured rate (at least ×2, at most ×100 per step)
        want = math.ceil(1.2 * number * min_time_s / max(best, 1e-9))
        number = min(max_number, max(2 * number, min(100 * number, want)))
    return number


def compare(fns: Mapping[str, Callable[[], Any]], *, repeats: int = 7, warmup: int = 2,
            number: int | None = None, min_time_s: float = 5e-3,
            max_number: int = 10_000,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time zero-argument callables side by side; returns seconds per call for each.

    Each callable first runs ``warmup`` times (compilation, caches), then ``repeats`` rounds run
    every callable once per round, in turn, ``number`` calls each (chosen per callable so a round
    takes ≥ ``min_time_s`` when ``number`` is None). The median of the rounds is the figure.
    ``clock`` is wall time by default; ``time.process_time`` counts only this process's CPU time
    (every thread's), for host-side work that other jobs on a shared machine would otherwise
    stretch by descheduling it.
    """
    if repeats < 1 or warmup < 0:
        raise MlsysError(f"timing.compare: repeats must be ≥ 1 and warmup ≥ 0, got "
                         f"repeats={repeats}, warmup={warmup}")
    if not fns:
        raise MlsysError("timing.compare: no callables given; pass a mapping name -> callable")
    numbers = {}
    for name, fn in fns.items():
        warm = 0.0
        for _ in range(warmup):
            warm = _run(fn, 1, clock)  # the last warm-up call is warm: a first guess
        numbers[name] = number or _calibrate(fn, min_time_s, max_number, warm, clock)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(_run(fn, numbers[name], clock) / numbers[name])
    return {name: Timing(statistics.median(s), min(s), max(s), repeats, numbers[name], tuple(s))
            for name, s in samples.items()}


def time_fn(fn: Callable[..., Any], *args, **kwargs) -> Timing:
    """Time ``fn(*args)`` alone; keyword arguments as for :func:`compare`."""
    return compare({"fn": lambda: fn(*args)}, **kwargs)["fn"]


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call, waited for (for first calls: trace + compile + run)."""
    return _run(fn, 1)
