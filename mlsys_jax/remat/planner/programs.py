"""Compiled gradient programs of one loss, each compiled once and reused by the plan, the policies
and the timing.

``Programs.compile`` lowers ``jax.grad`` of a function (parameters only), fingerprints the lowered
module and compiles it only if no program with the same module was compiled already (two built-in
policies can be one program: ``checkpoint_dots`` is ``dots_saveable``). ``quick=True`` compiles
for XLA's figures only (temp bytes, FLOPs), with LLVM's optimizations off (``QUICK``): XLA's HLO
passes and buffer assignment are the same, so are the figures, and the compile takes about two
thirds of the time; a quick program that is then timed is compiled again in full first (``full``).
The reference's first call warms the process up and keeps its gradients; ``time`` measures step
times side by side: interleaved rounds in a shuffled order, every program as often per round, as
paired ratios to the reference (``timing.compare``, ``timing.ratio``). Each program runs once
untimed first (a cold first call would count against it beside the warmed reference; the
reference's warm-up is its first call), and that call's gradients are compared with the
reference's right away and dropped, so no second set of gradients is held beside the steps'
buffers. Rounds run one at a time until the caller's ``decide`` says the outcome is settled
(``rounds.decide``), at most as many as fit a time budget or ``repeats``: at GPT-2 size on 2
cores one step takes longer than its compile.
"""
from __future__ import annotations

import hashlib
import math
import os
import random
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from mlsys_jax import timing
from mlsys_jax.parallel.shard.compare import leaf_diffs, leaf_scales
from mlsys_jax.progress import SILENT, Progress
from mlsys_jax.remat.planner.flat import FlatLoss

MIN_ROUND_S = 0.02      # a round of one program runs it at least this long (calls are batched)
BEST_OF = 3             # where rounds are cheap, each keeps the fastest of 3 batches (load only
#                         ever slows a batch down: timing.compare's best_of)
# XLA options of a compile for figures only: LLVM's optimization off (the HLO passes, and so the
# buffers and FLOPs XLA reports, are those of a full compile; tests/remat/test_rounds.py checks)
QUICK = {"xla_backend_optimization_level": 0}


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
    quick: bool = False                 # compiled for its figures only (QUICK): not to be timed
    lowered: object = field(repr=False, default=None)   # kept while quick, to compile in full


def _fingerprint(lowered) -> str:
    text = re.sub(r"^module @\S+", "module", lowered.as_text(), count=1)
    return hashlib.sha256(text.encode()).hexdigest()


def grad_difference(grads, reference, *, scale: float | None = None) -> tuple[float, float]:
    """Max |Δ| over all leaves, and that over the reference's max |g| (relative; ``scale``: that
    max, when known already). Leaf by leaf in float64 a block at a time, as ``shard`` compares
    (no temporary the size of a leaf: GPT-2 small's are 0.5 GB), a NaN or Inf where the
    reference has none an Inf difference — not lost in the max, whatever the leaf order."""
    worst = max(leaf_diffs(list(grads), list(reference)), default=0.0)
    if scale is None:
        scale = max(leaf_scales(list(reference)), default=0.0)
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
        self._reference_scale = 0.0     # their max |g|, read while they were in memory
        self._folder = None
        self.zero_grad_leaves = 0       # leaves whose reference gradient is exactly zero
        self._warm: set = set()         # ids of the executables called once already
        self.rounds, self.stopped = 0, ""   # the last timing session's rounds, and why it ended

    @property
    def args(self) -> tuple:
        return self.flat.diff, self.flat.batch

    def compile(self, label: str, fn, *, quick: bool = False) -> Program:
        """``jax.jit(jax.grad(fn))`` for the parameters only, compiled unless already compiled
        (``quick``: for its figures only, ``QUICK``)."""
        if label in self.by_label:
            return self.by_label[label]
        t0 = time.perf_counter()
        traced = jax.jit(jax.grad(fn, argnums=0)).trace(*self.args)
        lowered = traced.lower()
        key = _fingerprint(lowered)
        same = self._by_print.get(key)
        if same is not None and (quick or not same.quick):
            prog = Program(label, key, same.temp_bytes, same.flops, same.executable,
                           same_as=same.label, quick=same.quick, lowered=same.lowered)
        else:
            prog = Program(label, key, 0, 0.0, quick=quick, lowered=lowered if quick else None)
            self._build(prog, lowered, traced.jaxpr, t0)
            self._by_print[key] = prog
        self.by_label[label] = prog
        if self.reference is None:
            self.reference = prog
        return prog

    def alias(self, label: str, prog: Program) -> Program:
        """``prog`` under another ``label`` (the same function: nothing traced or compiled)."""
        if label not in self.by_label:
            self.by_label[label] = Program(label, prog.fingerprint, prog.temp_bytes, prog.flops,
                                           prog.executable, same_as=prog.same_as or prog.label,
                                           quick=prog.quick, lowered=prog.lowered)
        return self.by_label[label]

    def _build(self, prog: Program, lowered, jaxpr, t0: float) -> None:
        """Compile ``lowered`` (``QUICK`` when ``prog.quick``) and read XLA's figures."""
        exe = lowered.compile(QUICK if prog.quick else None)
        prog.executable = exe
        flops = (exe.cost_analysis() or {}).get("flops", float("nan"))
        if self.flops_per_trip:
            from mlsys_jax.cost.xla import xla_flops_per_trip

            flops = xla_flops_per_trip(jaxpr, flops)
        prog.temp_bytes = int(exe.memory_analysis().temp_size_in_bytes)
        prog.flops, prog.compile_s = float(flops), time.perf_counter() - t0

    def full(self, prog: Program) -> Program:
        """``prog`` compiled in full, for timing (the same program when it is already); the
        programs that are its module follow."""
        if not prog.quick:
            return prog
        src = self._by_print[prog.fingerprint]
        if src.quick:
            t0 = time.perf_counter()
            exe = src.lowered.compile()
            src.executable, src.quick, src.lowered = exe, False, None
            src.temp_bytes = int(exe.memory_analysis().temp_size_in_bytes)
            src.compile_s += time.perf_counter() - t0
        for p in self.by_label.values():
            if p.fingerprint == src.fingerprint and p is not src:
                p.executable, p.quick, p.lowered, p.temp_bytes = (src.executable, False, None,
                                                                  src.temp_bytes)
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
            self._reference_scale = max(leaf_scales(list(grads)), default=0.0)
            self._folder = tempfile.TemporaryDirectory(prefix="mlsys-remat-")
            self._reference_grads = []
            for k, g in enumerate(grads):
                path = os.path.join(self._folder.name, f"{k}.npy")
                np.save(path, np.asarray(g))
                self._reference_grads.append(path)
            del grads
            ref.grads_max_abs_diff = ref.grads_max_rel_diff = 0.0
            self._warm.add(id(ref.executable))
        return ref.first_call_s

    def check(self, prog: Program, grads) -> None:
        """Record ``prog``'s distance to the reference's gradients (``grads``: its output)."""
        reference = [np.load(path, mmap_mode="r") for path in self._reference_grads]
        prog.grads_max_abs_diff, prog.grads_max_rel_diff = grad_difference(
            grads, reference, scale=self._reference_scale)

    def time(self, progs: list[Program], repeats: int = 7, budget_s: float = 10.0, *,
             decide=None, least: int = 2) -> tuple[dict, dict]:
        """Time ``progs`` and the reference side by side. Returns (label -> step time over the
        reference's, paired: ``timing.Ratio``; label -> ``timing.Timing``). After one untimed
        call each (its gradients checked), rounds run one at a time: from the ``least``-th on,
        ``decide(times)`` (label -> Timing so far) may end the session with its reason; at most
        as many as fit ``budget_s`` (never fewer than ``least``) and ``repeats``. ``rounds`` and
        ``stopped`` say how many ran and why they stopped."""
        progs = [self.reference] + [self.full(p) for p in progs if p is not self.reference]
        distinct = list({id(p.executable): p for p in progs}.values())
        self.progress.stage(f"timing {len(distinct)} programs side by side (a warm-up call each "
                            "also checks its gradients against no remat's)")
        step_s = self.run_reference()            # an estimate for every program (a first call)
        number = max(1, math.ceil(MIN_ROUND_S / max(step_s, 1e-9)))
        round_s = number * step_s * len(distinct)
        best_of = BEST_OF if round_s * BEST_OF * 2 <= budget_s else 1
        fit = int(max(least, budget_s // (round_s * best_of)))
        most = min(repeats, fit) if repeats > 1 else 1
        span = f"{most}" if min(least, most) == most else f"{least} to {most}"
        self.progress.item(1, 1, f"a warm-up call each, then {span} interleaved rounds (fewer "
                                 f"once the outcome is settled), about {round_s * best_of:.2g} "
                                 "s a round")
        self._warm_up(distinct)
        args, samples = self.args, {p.label: [] for p in distinct}
        fns = {p.label: (lambda e=p.executable: e(*args)) for p in distinct}
        order, rng, why = list(fns.items()), random.Random(0), None
        for n in range(1, most + 1):
            rng.shuffle(order)
            got = timing.compare(dict(order), repeats=1, warmup=0, best_of=best_of,
                                 number=number, shuffle=True)
            for label, t in got.items():
                samples[label].append(t.samples[0])
            times = self._expand(progs, distinct, samples, number)
            if decide is not None and n >= least:
                why = decide(times)
                if why:
                    break
        self.rounds = n
        self.stopped = why or (f"the most asked for (repeats {repeats})" if most == repeats else
                               f"the most that fit the timing budget ({budget_s:g} s, about "
                               f"{round_s * best_of:.2g} s a round)")
        base = times[self.reference.label]
        return {label: timing.ratio(t, base) for label, t in times.items()}, times

    def _warm_up(self, distinct: list[Program]) -> None:
        """One untimed call of each program not called yet; its gradients are checked."""
        for p in distinct:
            if id(p.executable) in self._warm:
                continue
            grads = jax.block_until_ready(p.executable(*self.args))
            self._warm.add(id(p.executable))
            if p is not self.reference:
                self.check(p, grads)
            del grads

    def _expand(self, progs, distinct, samples: dict, number: int) -> dict:
        """label -> Timing for every program of ``progs`` (those that are another's module share
        its samples and its gradient check)."""
        times = {}
        for p in progs:
            src = next(q for q in distinct if q.executable is p.executable)
            p.grads_max_abs_diff, p.grads_max_rel_diff = (src.grads_max_abs_diff,
                                                          src.grads_max_rel_diff)
            s = samples[src.label]
            times[p.label] = timing.Timing(statistics.median(s), min(s), max(s), len(s), number,
                                           tuple(s))
        return times
