"""Side-by-side timing: median of repeats after warm-up, with min–max, and ratios between them.

On a shared, noisy machine an absolute time means little; a ratio of two medians measured in the
same run, with the candidates interleaved repeat by repeat (so a burst of load hits all of them),
is what the experiments and benchmarks report. Every callable's result is waited for with
``jax.block_until_ready`` (JAX dispatches asynchronously).

Microsecond calls need many short rounds instead of a few long ones: a round's time depends on
what ran just before it (caches, whether XLA:CPU's worker thread is still awake), so
``compare(..., shuffle=True)`` runs each round's callables in a fresh (seeded) order, and
``ratio(a, b, spread=(10, 90))`` reports the median of the per-round ratios with their 10th–90th
percentiles instead of the extremes thousands of rounds would reach.
"""
from __future__ import annotations

import math
import random
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
        """The median time per call, in µs."""
        return self.median_s * 1e6

    def to_dict(self) -> dict:
        """The timing in µs as JSON data."""
        return {"median_us": self.median_s * 1e6, "min_us": self.min_s * 1e6,
                "max_us": self.max_s * 1e6, "repeats": self.repeats, "number": self.number}

    def summary(self) -> str:
        """``median [min–max] µs`` for notes and tables."""
        return f"{self.median_s * 1e6:.4g} [{self.min_s * 1e6:.3g}–{self.max_s * 1e6:.3g}] µs"


@dataclass(frozen=True)
class Ratio:
    """``a / b`` of two timings: the median ratio, and its spread ``low``–``high`` (see ``ratio``)."""

    median: float
    low: float
    high: float
    spread: tuple = (0, 100)  # the percentiles of the per-round ratios that low and high are

    @property
    def bound_names(self) -> tuple:
        """What ``low`` and ``high`` are: ``("min", "max")`` or percentiles, ``("p10", "p90")``."""
        return ("min", "max") if self.spread == (0, 100) else \
            tuple(f"p{p:g}" for p in self.spread)

    def to_dict(self) -> dict:
        """The ratio and its bounds as JSON data, under the bounds' names."""
        lo, hi = self.bound_names
        return {"ratio": self.median, lo: self.low, hi: self.high}


def per_round(a: Timing, b: Timing) -> list[float]:
    """``a``'s time over ``b``'s in each round of one :func:`compare` call (paired samples)."""
    return [x / y for x, y in zip(a.samples, b.samples)]


def ratio(a: Timing, b: Timing, spread: tuple = (0, 100)) -> Ratio:
    """How many times slower ``a`` is than ``b``.

    When both come from one :func:`compare` call, the ratio is *paired*: the median over rounds of
    ``a``'s time over ``b``'s time in the same round, so load that comes and goes on a shared
    machine cancels; ``low``–``high`` are the ``spread`` percentiles of those per-round ratios
    (min–max by default). Otherwise: the ratio of medians, with the extreme ratios of the two
    ranges as min–max.
    """
    if not 0 <= spread[0] <= 50 <= spread[1] <= 100:
        raise MlsysError(f"timing.ratio: spread must be percentiles (low ≤ 50 ≤ high) within "
                         f"0–100, got {spread}")
    if a.samples and len(a.samples) == len(b.samples):
        paired = per_round(a, b)
        return Ratio(statistics.median(paired), percentile(paired, spread[0]),
                     percentile(paired, spread[1]), tuple(spread))
    return Ratio(a.median_s / b.median_s, a.min_s / b.max_s, a.max_s / b.min_s)


def percentile(values, p: float) -> float:
    """The ``p``-th percentile of ``values`` (linear between ranks; 0 and 100: min and max)."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * p / 100
    i = int(at)
    return ordered[i] if i + 1 >= len(ordered) else \
        ordered[i] + (ordered[i + 1] - ordered[i]) * (at - i)


AIM = 1.1  # a calibrated round's length over the target (see _calibrate)
AGREE = 1.25  # a trial's time a call over the last one's that is taken as no stall


def _run(fn: Callable[[], Any], number: int, clock: Callable[[], float] = time.perf_counter,
         keep: list | None = None) -> float:
    out = None
    t0 = clock()
    for _ in range(number):
        out = fn()
    jax.block_until_ready(out)
    elapsed = clock() - t0
    if keep is not None:
        keep.append(out)
    return elapsed


def _calibrate(fn: Callable[[], Any], min_time_s: float, max_number: int,
               per_call_s: float = 0.0, clock: Callable[[], float] = time.perf_counter) -> int:
    """Calls per round so that a round takes at least ``min_time_s`` (like timeit.autorange).

    Starts from half the count that ``per_call_s`` (a warm call, if known) suggests, and steps
    to ``AIM`` times the target at the rate the last trial measured: rounds just over the target,
    not up to twice it (which a doubling step gives), since every round of the timing costs what
    one round takes. A trial stalled by another process must not leave the rounds too short
    (short rounds are dominated by the wait for the result, not the calls), and a stall only
    lengthens a trial: so a trial over the target is taken where its calls ran no slower than
    the trial before's (within ``AGREE``), and otherwise decided by the best of three. A trial
    under the target needs no others: the count is too small either way.
    """
    number = min(max_number, max(1, int(0.5 * min_time_s / per_call_s))) if per_call_s > 0 else 1
    rate = None  # seconds a call, in the last trial under the target
    while number < max_number:
        best = _run(fn, number, clock)
        if best >= min_time_s:
            if rate is not None and best <= AGREE * rate * number:
                break  # as fast a call as the trial before: not stalled
            best = min(best, *(_run(fn, number, clock) for _ in range(2)))
            if best >= min_time_s:
                break
        rate = best / number
        # towards AIM × the target at the measured rate: at least one call more (each step
        # under the target grows the count by AIM or more), at most ×100
        want = math.ceil(AIM * number * min_time_s / max(best, 1e-9))
        number = min(max_number, max(number + 1, min(100 * number, want)))
    return number


def compare(fns: Mapping[str, Callable[[], Any]], *, repeats: int = 7, warmup: int = 2,
            number: int | Mapping[str, int] | None = None, min_time_s: float = 5e-3,
            max_number: int = 10_000, shuffle: bool = False, best_of: int = 1,
            clock: Callable[[], float] = time.perf_counter,
            first_result: Callable[[str, Any], None] | None = None) -> dict[str, Timing]:
    """Time zero-argument callables side by side; returns seconds per call for each.

    Each callable first runs ``warmup`` times (compilation, caches), then ``repeats`` rounds run
    every callable once per round, in turn, ``number`` calls each (chosen per callable so a round
    takes ≥ ``min_time_s`` when ``number`` is None or does not name it), the last call's result
    waited for: a fixed cost per round (waking XLA:CPU's worker, the final wait) is spread over
    ``number`` calls, so callables compared closely should get the same ``number``. The
    median of the rounds is the figure. ``shuffle``: each round runs the callables in a new order
    (seeded, so runs repeat): each one follows every other equally often on average.
    ``clock`` is wall time by default; ``time.process_time`` counts only this process's CPU time
    (every thread's), for host-side work that other jobs on a shared machine would otherwise
    stretch by descheduling it. ``best_of``: each round runs every callable's batch that many
    times, interleaved, and keeps each one's fastest batch — another job only ever makes a batch
    slower, so the round's ratios measure the code, not the moment (as ``timeit`` advises).
    ``first_result(name, result)`` is called with each callable's first result once its first
    timed batch has been measured (outside the timing), e.g. to check values without spending a
    separate warm-up call on it.
    """
    if repeats < 1 or warmup < 0 or best_of < 1:
        raise MlsysError(f"timing.compare: repeats and best_of must be ≥ 1 and warmup ≥ 0, got "
                         f"repeats={repeats}, best_of={best_of}, warmup={warmup}")
    if not fns:
        raise MlsysError("timing.compare: no callables given; pass a mapping name -> callable")
    numbers = {}
    for name, fn in fns.items():
        warm = 0.0
        for _ in range(warmup):
            warm = _run(fn, 1, clock)  # the last warm-up call is warm: a first guess
        given = number.get(name) if isinstance(number, Mapping) else number
        numbers[name] = given or _calibrate(fn, min_time_s, max_number, warm, clock)
    samples: dict[str, list[float]] = {name: [] for name in fns}
    order, rng, seen = list(fns.items()), random.Random(0), set()
    for _ in range(repeats):
        best = {name: math.inf for name in fns}
        for _ in range(best_of):
            if shuffle:
                rng.shuffle(order)
            for name, fn in order:
                keep = [] if first_result is not None and name not in seen else None
                best[name] = min(best[name], _run(fn, numbers[name], clock, keep) / numbers[name])
                if keep:
                    seen.add(name)
                    first_result(name, keep.pop())
        for name in fns:
            samples[name].append(best[name])
    return {name: Timing(statistics.median(s), min(s), max(s), repeats, numbers[name], tuple(s))
            for name, s in samples.items()}


def time_fn(fn: Callable[..., Any], *args, **kwargs) -> Timing:
    """Time ``fn(*args)`` alone; keyword arguments as for :func:`compare`."""
    return compare({"fn": lambda: fn(*args)}, **kwargs)["fn"]


def time_once(fn: Callable[[], Any]) -> float:
    """Seconds for one call, waited for (for first calls: trace + compile + run)."""
    return _run(fn, 1)
