"""Compiling programs to time alone, and timing them in interleaved rounds that stop early where
the figure is already decided.

A figure is the median of ``repeats`` rounds (each the best of two batches). After the first
``repeats // 2 + 1`` rounds, the median of all of them can only lie between the lowest and the
highest of those (the rounds left are fewer than half), so a program whose first rounds all lie
within ``DECIDED`` of their median is not timed again: the median of its first rounds is within
``DECIDED`` of the figure every round would give. The others run the rounds left, with the same
calls per batch, and the median of all their rounds is their figure.
"""
from __future__ import annotations

import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from mlsys_jax import timing

DECIDED = 0.05  # the first rounds' spread (max − min over median) that decides a figure
COMPILE_THREADS = 4  # programs compiled at once (at most one per core)


def timed(calls: dict, *, repeats: int, min_time_s: float, warmup: int = 1) -> dict:
    """name -> :class:`timing.Timing` of each zero-argument call: interleaved, shuffled rounds
    (``timing.compare``), each the best of two batches of at least ``min_time_s``; the rounds
    after the first ``repeats // 2 + 1`` only for the calls they can still move (module doc)."""
    first = repeats // 2 + 1
    t = timing.compare(calls, repeats=min(first, repeats), warmup=warmup,
                       min_time_s=min_time_s, best_of=2, shuffle=True)
    if first >= repeats:
        return t
    undecided = {k: c for k, c in calls.items() if not decided(t[k])}
    if not undecided:
        return t
    more = timing.compare(undecided, repeats=repeats - first, warmup=0, best_of=2, shuffle=True,
                          number={k: t[k].number for k in undecided})
    return {**t, **{k: _joined(t[k], more[k]) for k in more}}


def decided(t: timing.Timing) -> bool:
    """Whether the rounds so far pin the median of all of them within ``DECIDED`` (module doc)."""
    return t.max_s - t.min_s <= DECIDED * t.median_s


def _joined(a: timing.Timing, b: timing.Timing) -> timing.Timing:
    s = a.samples + b.samples
    return timing.Timing(statistics.median(s), min(s), max(s), len(s), a.number, s)


def compile_all(programs: list, *, side=None, warm: list = ()) -> list:
    """``(call, why)`` for each program (:func:`compiled`), compiled several at once — XLA compiles
    outside the GIL, and on a cold first run compiling is most of the time — in their order (not
    the longest first: two long compiles at once each ran slower, docs/costs.md). ``side``: a
    ``SideWork`` started first in the same pool; ``warm``: zero-argument calls run after the
    programs (other jit calls to compile). All of it is finished on return."""
    tasks = len(programs) + len(warm) + (side is not None)
    workers = max(1, min(tasks, os.cpu_count() or 1, COMPILE_THREADS))
    with ThreadPoolExecutor(workers) as pool:  # joined (the side work too) before any timing
        if side is not None:
            side.future = pool.submit(side.fn)
        futures = [pool.submit(compiled, p) for p in programs]
        for call in warm:
            pool.submit(call)  # a failure shows again when the call is timed
        return [f.result() for f in futures]


def compiled(p) -> tuple:
    """``(call, "")``: ``p`` compiled, warmed and bound to seeded arguments (a zero-argument
    call); or ``(None, why)`` when XLA cannot run the group alone (it then keeps the roofline,
    with the reason)."""
    import jax

    fn, args = jax.jit(p.fn), p.example_arguments(seed=0)
    try:
        jax.block_until_ready(fn(*args))
    except Exception as e:  # noqa: BLE001 — whatever XLA raises, the kernel is not timed
        first = (str(e).strip().splitlines() or [""])[0][:120]
        return None, f"could not run alone: {type(e).__name__}: {first}"
    return partial(fn, *args), ""
