"""``--hw here``: a measured-operator model of the backend JAX runs on (TASO measures each
operator once on the device and caches it; the roofline stays the lecture's model).

Each distinct kernel of the fused model (an op, or a fused group) is compiled alone and timed in
interleaved rounds (each the best of two batches; the median; ``rounds.py``), once per machine:
its time is
cached on disk (:mod:`mlsys_jax.cost.cache`, keyed by JAX/jaxlib, backend, device kind and
machine) under its structural key (``programs.py``), so a later run, or another graph that
shares the kernel (a search's candidates share almost all of theirs), reuses it. A program's
prediction is what its kernels do inside it: each kernel's time alone less the dispatch of its
own call, plus a small per-kernel overhead, plus one dispatch for the program (``dispatch.py``).
Unfused, one call per op, it is the sum of the ops' calls: eager execution. Measuring stops at a
time budget; the kernels beyond it, and kernels that cannot run alone (a ``while`` loop, a
callback, a collective), keep the roofline and say why.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path

from mlsys_jax.cost import cache
from mlsys_jax.cost.hardware import MEASURE_BUDGET_S
from mlsys_jax.cost.here.dispatch import DispatchCost, dispatch_calls, measure_dispatch, warm
from mlsys_jax.cost.here.graphs import span_program, spans
from mlsys_jax.cost.here.programs import constants, kernel_program
from mlsys_jax.cost.here.rounds import compile_all, timed

CHUNK = 32  # kernels compiled, then timed side by side, at a time: the budget is checked between


def _usable(key: str, value) -> bool:
    """A cached entry whose figures are real numbers (a corrupt or hand-edited file's are not)."""
    if key.startswith("kernel:"):
        return isinstance(value, dict) and cache.finite(value.get("us"))
    if key == "dispatch":
        fields = ("call_us", "per_input_us", "per_output_us", "per_kernel_us")
        return isinstance(value, dict) and set(value) == set(fields) and \
            cache.finite(value["call_us"]) and \
            all(cache.finite(value[f], positive=False) for f in fields[1:])
    return key.startswith("failed:") and isinstance(value, str)


def _checked(entries: dict, path) -> dict:
    """The usable entries; the rest are measured again, said in one line."""
    bad = [k for k, v in entries.items() if not _usable(k, v)]
    if bad:
        print(f"mlsys-jax: note: {len(bad)} entries of {path} are not usable figures (e.g. "
              f"{bad[0]!r}: {str(entries[bad[0]])[:60]}); measuring them again", file=sys.stderr)
    return {k: v for k, v in entries.items() if k not in bad}


class OperatorModel:
    """Measured kernel times of this machine, cached on disk, and the budget to measure more."""

    def __init__(self, path=None, budget_s: float = MEASURE_BUDGET_S, repeats: int = 5,
                 min_time_s: float = 0.002, dispatch_repeats: int = 5, progress: bool = True):
        self.identity = cache.identity()
        self.path = Path(path) if path else (cache.cache_dir() /
                                             f"operators-{cache.identity_key(self.identity)}.json")
        self.budget_s, self.spent_s = budget_s, 0.0
        self.repeats, self.min_time_s, self.dispatch_repeats = repeats, min_time_s, dispatch_repeats
        self.progress = progress
        self.entries = _checked(cache.load(self.path, self.identity), self.path)
        self.measured_now = 0  # kernels this process measured (the rest came from the cache)
        # the set a command shows (True: fused, False: unfused, None: both are measured); the
        # other set reads the cache and derives the rest from the shown set's kernels
        self.shown: bool | None = None
        # the whole program compiled (``inspect``'s, for XLA's figures), run beside the first
        # kernel compiles; while set, the fused set's XLA graphs are read from it (``graphs``)
        self.side: SideWork | None = None
        self.hardware = None  # ``here`` timed by this object (``device.here_hardware``)
        # the dispatch programs (``dispatch.dispatch_calls``), compiled beside the first kernels
        self._dispatch_calls: dict | None = None

    # -- the figures ------------------------------------------------------------------------
    def dispatch(self) -> DispatchCost | None:
        """The dispatch overheads here: cached, else measured now (None with no budget)."""
        hit = self.entries.get("dispatch")
        if hit:
            return DispatchCost(**hit)
        if self.budget_s <= self.spent_s:
            return None
        t0 = time.perf_counter()
        found = measure_dispatch(self.dispatch_repeats, calls=self._dispatch_calls)
        self._dispatch_calls = None
        self.spent_s += time.perf_counter() - t0
        self._save({"dispatch": found.to_dict()})
        return found

    def kernel_times(self, programs: list, *, measure: bool = True) -> dict:
        """key -> (µs alone, "measured" | "cached") for the programs that have a time; new ones
        are measured within the budget (unless not ``measure``), fused groups as XLA compiles
        them."""
        out, todo = {}, {}
        for p in programs:
            hit = self.entries.get("kernel:" + p.key)
            if hit:
                out[p.key] = (hit["us"], "cached")
            elif not p.unmeasurable:
                todo.setdefault(p.key, p)
        if todo and measure:
            out.update(self._measure(list(todo.values())))
        return out

    # -- measuring --------------------------------------------------------------------------
    def _measure(self, programs: list) -> dict:
        out, t0, done, failed = {}, time.perf_counter(), 0, 0

        def over() -> bool:
            return self.spent_s + time.perf_counter() - t0 >= self.budget_s
        pending = list(programs)
        while pending and not over():
            chunk, pending = pending[:CHUNK], pending[CHUNK:]
            calls, labels = {}, {}
            for p, call in zip(chunk, self._compile_all(chunk)):
                if call is None:
                    failed += 1
                else:
                    calls[p.key], labels[p.key] = call, p.label
            if not calls:
                continue
            t = timed(calls, repeats=self.repeats, min_time_s=self.min_time_s)
            self._save({"kernel:" + k: {"us": v.median_us, "min_us": v.min_s * 1e6,
                                        "max_us": v.max_s * 1e6, "rounds": v.repeats,
                                        "label": labels[k]} for k, v in t.items()})
            out.update({k: (v.median_us, "measured") for k, v in t.items()})
            done += len(calls)
            self.measured_now += len(calls)
            self._say(f"measured {done} of {len(programs)} new kernels alone "
                      f"({time.perf_counter() - t0:.1f} s of a {self.budget_s:g} s budget)")
        self.spent_s += time.perf_counter() - t0
        if failed:
            self._say(f"{failed} kernels could not run alone: they keep the roofline")
        if pending:
            self._say(f"--measure-budget reached: {len(pending)} kernels keep the roofline "
                      "(marked in the table)")
        return out

    def _compile_all(self, chunk: list) -> list:
        """Each program of ``chunk`` compiled and warmed (``rounds.compile_all``), beside the
        side work and, when the dispatch is not cached yet, its programs. Failures are stored
        with their reason (they keep the roofline)."""
        side = self.side if self.side is not None and self.side.future is None else None
        extra = []
        if self._dispatch_calls is None and "dispatch" not in self.entries:
            self._dispatch_calls = dispatch_calls()
            extra = [partial(warm, c) for c in self._dispatch_calls.values()]
        done = compile_all(chunk, side=side, warm=extra)
        self._save({"failed:" + p.key: why for p, (_, why) in zip(chunk, done) if why})
        return [call for call, _ in done]

    def _save(self, entries: dict) -> None:
        self.entries.update(entries)
        cache.store(self.path, self.identity, entries)

    def _say(self, text: str) -> None:
        if self.progress:
            print(f"mlsys-jax: here: {text}", file=sys.stderr, flush=True)

    # -- the model --------------------------------------------------------------------------
    def fill(self, closed, kernels: list, fused: bool, hw) -> tuple[list, float]:
        """``kernels`` with their times here, and the program's dispatch overhead (µs). When a
        command shows the other set (``shown``), nothing of this one is measured: its kernels
        come from the cache, else are derived from the shown set's (:func:`derive`)."""
        programs = self.programs(closed, kernels)
        measure = self.shown is None or self.shown == fused
        times = self.kernel_times(programs, measure=measure)
        # the set not shown reads cached graphs only: its compile is not awaited for it
        started = self.side is not None and self.side.future is not None
        graphs = self.graphs(closed, kernels) if fused and (measure or started) else []
        times.update(self.kernel_times([p for _, p in graphs], measure=measure))
        filled, overhead = self.assemble(closed, kernels, programs, times, fused, hw,
                                         graphs=graphs)
        if measure or all(k.model != "roofline" for k in filled):
            return filled, overhead
        from mlsys_jax.cost.model import kernels as group_kernels

        other = group_kernels(closed, fused=not fused, hw=hw)
        measured, _ = self.fill(closed, other, not fused, hw)
        # kernels both sets share (a contraction alone) are in the cache now
        times = self.kernel_times(programs + [p for _, p in graphs], measure=False)
        filled, overhead = self.assemble(closed, kernels, programs, times, fused, hw,
                                         graphs=graphs)
        return derive(filled, programs, measured, fused, self.dispatch()), overhead

    def graphs(self, closed, kernels: list) -> list:
        """``(span, program)`` for each run of the fused ``kernels`` that XLA compiles as one
        graph (``graphs.py``), read from the compiled whole program when one is at hand
        (``side``); none without it, or when it did not compile."""
        if self.side is None:
            return []
        try:
            text = self.side.result().as_text()
        except Exception:  # noqa: BLE001 — its caller reports the compile's error
            return []
        consts, returned = constants(closed), set(closed.jaxpr.outvars)
        return [(r, span_program(kernels, r, consts, returned)) for r in spans(text, kernels)]

    @staticmethod
    def programs(closed, kernels: list) -> list:
        """Each kernel's program (``programs.kernel_program``)."""
        consts = constants(closed)
        return [kernel_program(k, consts) for k in kernels]

    def assemble(self, closed, kernels, programs, times: dict, fused: bool, hw, *,
                 graphs: list = ()) -> tuple[list, float]:
        """The prediction from kernel times alone (``times``: key -> (µs, source)). Fused, a
        kernel adds its time alone less its own call's dispatch, plus the per-kernel overhead,
        and the program adds one dispatch; unfused (one call per op, as eager execution runs)
        each kernel adds its whole call. A run of kernels XLA compiles as one graph
        (``graphs``: span, program) takes that graph's time alone, shared among them."""
        d = self.dispatch() or DispatchCost(hw.launch_s * 1e6, 0.0, 0.0, 0.0)
        filled = []
        for k, p in zip(kernels, programs):
            bound, kind = _bound_us(k, hw)
            call = d.call(p.n_inputs, p.n_outputs)
            if p.key in times:
                alone, source = times[p.key]
                run = max(alone - call, 0.0)
                t = run + d.per_kernel_us if fused else alone
                filled.append(replace(k, time_us=t, bound=kind, model=source, bound_us=bound,
                                      run_us=run))
            else:
                why = (p.unmeasurable or self.entries.get("failed:" + p.key)
                       or "not measured: over --measure-budget")
                t = bound + (d.per_kernel_us if fused else call)
                filled.append(replace(k, time_us=t, bound=kind, model="roofline", why=why,
                                      bound_us=bound))
        for span, p in graphs:
            if p.key in times:
                filled[span.start:span.stop] = _shared(filled[span.start:span.stop], p,
                                                       times[p.key], d)
        jaxpr = closed.jaxpr
        overhead = d.call(len(jaxpr.invars), len(jaxpr.outvars)) if fused else 0.0
        return filled, overhead


class SideWork:
    """A compile the command needs anyway (``inspect``'s whole program, for XLA's figures), run
    beside the first chunk's kernel compiles — a cold run is mostly compiling — and finished
    before any kernel is timed; run when asked for if no kernel needed compiling."""

    def __init__(self, fn):
        self.fn, self.future = fn, None

    def result(self):
        """The work's result (its exception raised here, as if called now), run once."""
        if self.future is None:
            self.future = Future()
            try:
                self.future.set_result(self.fn())
            except Exception as e:  # noqa: BLE001 — kept, raised to each caller
                self.future.set_exception(e)
        return self.future.result()


def _shared(members: list, p, time: tuple, d) -> list:
    """``members`` (kernels XLA runs as one graph) with the graph's run time alone shared in
    proportion to their own (their roofline bounds where one has none), each plus the
    per-kernel overhead."""
    alone, source = time
    run = max(alone - d.call(p.n_inputs, p.n_outputs), 0.0)
    weights = [k.run_us for k in members]
    if any(w is None for w in weights) or not sum(weights):
        weights = [k.bound_us or 1.0 for k in members]
    total = sum(weights)
    why = (f"XLA compiles these {len(members)} kernels as one graph (YNNPACK), which does not "
           "run as they do alone: the graph was compiled and timed alone, its time shared")
    return [replace(k, run_us=run * w / total, time_us=run * w / total + d.per_kernel_us,
                    model=source, why=why) for k, w in zip(members, weights)]


def derive(kernels: list, programs: list, shown: list, fused: bool, d) -> list:
    """The kernels of the set not shown that have no time of their own, from the shown set's
    (``shown``, the other grouping of the same op view): an op alone gets its fused kernel's
    run time in proportion to its roofline bound, plus its own call; a fused kernel the run
    times of its ops, plus the per-kernel overhead. Marked ``derived``; the rest unchanged."""
    at = {i: k for k in shown for i in k.index}
    out = []
    for k, p in zip(kernels, programs):
        sources = list({id(at[i]): at[i] for i in k.index if i in at}.values())
        if k.model != "roofline" or p.unmeasurable or d is None or \
                not sources or any(s.run_us is None for s in sources):
            why = ("not measured: the table shows the other set, which has no time for it"
                   if k.model == "roofline" and k.why.startswith("not measured") else k.why)
            out.append(replace(k, why=why))
            continue
        if fused:
            run, extra = sum(s.run_us for s in sources), d.per_kernel_us
        else:
            (src,) = sources
            members = [s for s in kernels if set(s.index) <= set(src.index)]
            total = sum(s.bound_us for s in members)
            share = k.bound_us / total if total else 1 / max(len(members), 1)
            run, extra = src.run_us * share, d.call(p.n_inputs, p.n_outputs)
        out.append(replace(k, time_us=run + extra, run_us=run, model="derived",
                           why=f"derived from the {'unfused' if fused else 'fused'} kernels "
                               f"measured (the table's); {'--fused' if fused else '--unfused'} "
                               "measures these"))
    return out


def _bound_us(k, hw) -> tuple[float, str]:
    """The roofline bound of a kernel (µs, no launch) and which side of the ridge it is on."""
    compute, memory = k.flops / hw.peak(k.dtype), k.bytes / hw.bandwidth
    return max(compute, memory) * 1e6, "compute" if compute > memory else "memory"


_MODELS: dict = {}


def operator_model() -> OperatorModel:
    """This process's model for the current cache directory (one per directory, so tests that
    point ``XDG_CACHE_HOME`` elsewhere get their own)."""
    where = cache.cache_dir()
    if where not in _MODELS:
        _MODELS[where] = OperatorModel()
    return _MODELS[where]
