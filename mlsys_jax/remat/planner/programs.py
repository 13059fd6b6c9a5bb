"""Compiled gradient programs of one loss, each compiled once and reused by the plan, the policies
and the timing.

``Programs.compile`` lowers ``jax.grad`` of a function (parameters only), fingerprints the lowered
module and compiles it only if no program with the same module was compiled already (two built-in
policies can be one program: ``checkpoint_dots`` is ``dots_saveable``). The reference's first
call warms the process up and keeps its gradients; ``time`` measures step times side by side:
interleaved rounds in a shuffled order, every program as often per round, as paired ratios to the
reference (``timing.compare``, ``timing.ratio``). Each program runs once untimed first (a cold
first call would count against it beside the warmed reference); its first timed result is
compared with the reference's gradients right away and dropped, so no second set of gradients is
held beside the steps' buffers.
Rounds are as many as fit a time budget (at least two, so there is a spread; at most
``repeats``): at GPT-2 size on 2 cores one step takes longer than its compile.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import tempfile
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from mlsys_jax import timing
from mlsys_jax.progress import SILENT, Progress
from mlsys_jax.remat.planner.flat import FlatLoss

MIN_ROUND_S = 0.02      # a round of one program runs it at least this long (calls are batched)
BEST_OF = 3             # where rounds are cheap, each keeps the fastest of 3 batches (load only
#                         ever slows a batch down: timing.compare's best_of)


@dataclass
class Program:
    """One compiled gradient: XLA's own figures, and what running it measured."""

    label: str
    fingerprint: str
    temp_bytes: int
    flops: float
    executable: object = field(repr=False, default=None)
    first_call_s: float | None = None
    grads_max_abs_diff: float | None = None
    grads_max_rel_diff: float | None = None
    same_as: str | None = None          # the label of the program it is (same module)
    compile_s: float = 0.0              # lowering and compiling (0: the same module compiled)


def _fingerprint(lowered) -> str:
    text = re.sub(r"^module @\S+", "module", lowered.as_text(), count=1)
    return hashlib.sha256(text.encode()).hexdigest()


def grad_difference(grads, reference) -> tuple[float, float]:
    """Max |Δ| over all leaves, and that over the reference's max |g| (relative)."""
    diffs = [float(np.max(np.abs(np.asarray(a) - np.asarray(b)), initial=0.0))
             for a, b in zip(grads, reference)]
    scale = max((float(np.max(np.abs(np.asarray(b)), initial=0.0)) for b in reference),
                default=0.0)
    worst = max(diffs, default=0.0)
    return worst, worst / scale if scale else worst


class Programs:
    """The compiled programs of one flat loss, by label; the reference is the first compiled."""

    def __init__(self, flat: FlatLoss, progress: Progress = SILENT, *,
                 flops_per_trip: bool = False):
        # flops_per_trip: FLOPs with scan bodies counted per trip (cost.xla), where they decide
        # (on shapes); XLA's cost analysis alone counts a while body once
        self.flat, self.progress, self.flops_per_trip = flat, progress, flops_per_trip
        self.by_label: dict[str, Program] = {}
        self._by_print: dict[str, Program] = {}
        self.reference: Program | None = None
        self._reference_grads = None    # paths of the reference's gradients (.npy, per leaf)
        self._folder = None
        self.zero_grad_leaves = 0       # leaves whose reference gradient is exactly zero

    @property
    def args(self) -> tuple:
        return self.flat.diff, self.flat.batch

    def compile(self, label: str, fn) -> Program:
        """``jax.jit(jax.grad(fn))`` for the parameters only, compiled unless already compiled."""
        if label in self.by_label:
            return self.by_label[label]
        t0 = time.perf_counter()
        traced = jax.jit(jax.grad(fn, argnums=0)).trace(*self.args)
        lowered = traced.lower()
        key = _fingerprint(lowered)
        same = self._by_print.get(key)
        if same is not None:
            prog = Program(label, key, same.temp_bytes, same.flops, same.executable,
                           same_as=same.label)
        else:
            exe = lowered.compile()
            flops = (exe.cost_analysis() or {}).get("flops", float("nan"))
            if self.flops_per_trip:
                from mlsys_jax.cost.xla import xla_flops_per_trip

                flops = xla_flops_per_trip(traced.jaxpr, flops)
            prog = Program(label, key, int(exe.memory_analysis().temp_size_in_bytes),
                           float(flops), exe, compile_s=time.perf_counter() - t0)
            self._by_print[key] = prog
        self.by_label[label] = prog
        if self.reference is None:
            self.reference = prog
        return prog

    def run_reference(self) -> float:
        """The reference's first call (it warms the process up too): its gradients are what the
        other programs are checked against. They wait in files, mapped back only for a check:
        held in memory they would sit beside every later step's buffers and raise the peak by
        their size (GPT-2 small: 0.5 GB). Returns the call's seconds."""
        ref = self.reference
        if self._reference_grads is None:
            t0 = time.perf_counter()
            grads = jax.block_until_ready(ref.executable(*self.args))
            ref.first_call_s = time.perf_counter() - t0
            self.zero_grad_leaves = sum(not np.any(np.asarray(g)) for g in grads)
            self._folder = tempfile.TemporaryDirectory(prefix="mlsys-remat-")
            self._reference_grads = []
            for k, g in enumerate(grads):
                path = os.path.join(self._folder.name, f"{k}.npy")
                np.save(path, np.asarray(g))
                self._reference_grads.append(path)
            del grads
            ref.grads_max_abs_diff = ref.grads_max_rel_diff = 0.0
        return ref.first_call_s

    def check(self, prog: Program, grads) -> None:
        """Record ``prog``'s distance to the reference's gradients (``grads``: its output)."""
        reference = [np.load(path, mmap_mode="r") for path in self._reference_grads]
        prog.grads_max_abs_diff, prog.grads_max_rel_diff = grad_difference(grads, reference)

    def time(self, progs: list[Program], repeats: int = 7, budget_s: float = 10.0
             ) -> tuple[dict, dict]:
        """Time ``progs`` and the reference side by side. Returns (label -> step time over the
        reference's, paired: ``timing.Ratio``; label -> ``timing.Timing``), with as many rounds
        as fit ``budget_s`` (2 ≤ rounds ≤ ``repeats``; one if ``repeats`` is 1), after one
        untimed call each. A program's first timed batch is also its gradient check."""
        progs = [self.reference] + [p for p in progs if p is not self.reference]
        distinct = list({id(p.executable): p for p in progs}.values())
        self.progress.stage(f"timing {len(distinct)} programs side by side (their first timed "
                            "calls also check the gradients against no remat's)")
        step_s = self.run_reference()            # an estimate for every program (a first call)
        number = max(1, math.ceil(MIN_ROUND_S / max(step_s, 1e-9)))
        round_s = number * step_s * len(distinct)
        best_of = BEST_OF if round_s * BEST_OF * 2 <= budget_s else 1
        rounds = int(min(repeats, max(2, budget_s // (round_s * best_of)))) if repeats > 1 else 1
        self.progress.item(1, 1, f"a warm-up call each, then {rounds} interleaved rounds, "
                                 f"about {(1 + rounds * best_of) * round_s:.0f} s")
        args, by_label = self.args, {p.label: p for p in distinct}

        def first(label, grads):
            if by_label[label] is not self.reference:
                self.check(by_label[label], grads)
        fns = {p.label: (lambda e=p.executable: e(*args)) for p in distinct}
        times = timing.compare(fns, repeats=rounds, warmup=1, best_of=best_of,
                               number={label: number for label in fns}, shuffle=True,
                               first_result=first)
        for p in progs:                          # programs that are another's module
            src = next(q for q in distinct if q.executable is p.executable)
            p.grads_max_abs_diff, p.grads_max_rel_diff = (src.grads_max_abs_diff,
                                                          src.grads_max_rel_diff)
        times = {p.label: times[next(q.label for q in distinct
                                     if q.executable is p.executable)] for p in progs}
        base = times[self.reference.label]
        return {label: timing.ratio(t, base) for label, t in times.items()}, times
