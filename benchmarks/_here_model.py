"""The ``here`` measured-operator model against XLA on this machine (figures of ``bench passes``).

1. Whole models, as ``inspect`` sees them (parameters are arguments): the project's flax
   ResNet, a flax imagenet-style ResNet-18, haiku's ResNet18, Keras' MobileNetV2 (α 0.35,
   depthwise convolutions), the 2-layer flax transformer and Keras' ResNet50 (none in
   ``--quick``, whose one model is item 4's). The model measures its kernels into a fresh
   cache, as a new user's first run does, with the whole program compiled at hand as
   ``inspect`` hands it over (kernels XLA runs
   as one YNNPACK graph are timed as that graph too, ``cost/here/graphs.py``); then the whole
   program under ``jax.jit`` and every distinct kernel (and graph) alone are timed in the same
   interleaved rounds, and each round's prediction (the model's formula on that
   round's kernel times) is divided by that round's whole-program time: the median of those
   paired ratios is ``here_predicted_over_measured_ratio`` (target 0.67–1.5). The cached
   prediction over the median whole time is the unpaired figure; each kernel's cached time
   over its time alone in the rounds is the per-kernel check (target 0.5–2×).
2. A second run reuses the cache: ``inspect --hw here`` beside ``inspect --hw cpu``, each a fresh
   process, in paired rounds (target: under 1.2× the time of ``--hw cpu``; not in ``--quick``).
3. The search ranks graphs by the model (``search(..., hw=here)``, no graph timed whole) on the
   §4.2 block and (outside ``--quick``) on the project's flax ResNet (parameters constant, as
   ``optimize`` sees it):
   its pick is timed beside every graph the search's moves reach in two steps from the default
   pipeline's result (and the original): ``here_search_picks_fastest`` = 1 when the pick is the
   fastest, within 5% (a tie is a tie).
4. Models it was not tuned on (``_here_models_unseen.py``: haiku's ResNet18 in training mode,
   an equinox MLP-Mixer, a flax nnx CNN, a Keras ConvNeXt-like net with depthwise 7 × 7
   convolutions; outside ``--quick`` haiku's ResNet18 at 224 px, whose last stage XLA runs as
   one YNNPACK graph; ``--quick``: the MLP-Mixer alone, the cheapest to measure), the same
   paired figures as 1. under ``here_unseen_*`` (target 0.67–1.5), with the ``cpu`` roofline's
   estimate over the measured time beside them.
5. A cold ``inspect --hw here`` over a process that builds, compiles and calls the model once
   (``_here_cold.py``, target ≤ 1.5).
"""
from __future__ import annotations

import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import jax

from mlsys_jax import cost, ir, timing
from mlsys_jax.cost.here import OperatorModel, here_hardware
from mlsys_jax.cost.here.operators import SideWork
from mlsys_jax.cost.xla import compile_on_shapes

from benchmarks import building

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MODELS = (  # (figure name, example file, factory, keyword arguments, also in --quick)
    ("flax_resnet", "flax_resnet.py", "inspect", {}, False),
    ("flax_imagenet_resnet18_64px", "inference_nets.py", "flax_resnet18", {}, False),
    ("haiku_resnet18_64px", "inference_nets.py", "haiku_resnet18", {}, False),
    ("keras_mobilenetv2_a035_96px", "inference_nets.py", "keras_mobilenet", {}, False),
    ("flax_transformer_2_layers", "flax_transformer.py", "inspect", {}, False),
    ("keras_resnet50_64px", "inference_nets.py", "keras_resnet50", {}, False),
)


def _factory(file: str, name: str, kwargs: dict):
    from benchmarks._cpu_model import _example

    return partial(getattr(_example(EXAMPLES / file), name), **kwargs)


def paired_accuracy(closed, inputs, model: OperatorModel, rounds: int) -> dict:
    """The cached prediction, then the whole program and its distinct kernels timed in the same
    rounds: per-round predicted over measured, and each kernel's cached time over its time
    alone in the rounds."""
    hw = here_hardware(model)
    # the whole program compiled, as ``inspect`` hands it over: the model reads XLA's graphs
    model.side = SideWork(lambda: compile_on_shapes(closed))
    try:
        predicted = cost.estimate(closed, hw=hw)
        raw = cost.kernels(closed, fused=True, hw=hw)
        programs, graphs = model.programs(closed, raw), model.graphs(closed, raw)
    finally:
        model.side = None
    every = programs + [p for _, p in graphs]
    distinct = {p.key: p for p in every if "kernel:" + p.key in model.entries}
    calls = {"whole": partial(jax.jit(ir.as_function(closed)), *inputs)}
    for i, (key, p) in enumerate(distinct.items()):
        calls[key] = partial(jax.jit(p.fn), *p.example_arguments(seed=i))
    # best of 3 batches a round: another job's burst only ever slows a batch, and the per-kernel
    # check compares these rounds with times the cache measured at another moment
    t = timing.compare(calls, repeats=rounds, min_time_s=0.01, best_of=3, shuffle=True)
    per_round = []
    for r in range(rounds):
        if not distinct:  # no kernel of the cache to re-time: the cached prediction, unpaired
            per_round.append(predicted.time_us / (t["whole"].samples[r] * 1e6))
            continue
        times = {k: (t[k].samples[r] * 1e6, "measured") for k in distinct}
        filled, overhead = model.assemble(closed, raw, programs, times, True, hw,
                                          graphs=graphs)
        predicted_us = sum(k.time_us for k in filled) + overhead
        per_round.append(predicted_us / (t["whole"].samples[r] * 1e6))
    cached = {k: model.entries["kernel:" + k]["us"] for k in distinct}
    ratios = {k: cached[k] / t[k].median_us for k in distinct}
    far = max(ratios, key=lambda k: abs(math.log(ratios[k])), default=None)
    furthest = None if far is None else (distinct[far].label, cached[far], t[far].median_us)
    rated = [k for k in predicted.kernels if k.efficiency is not None]
    least = max(rated, key=lambda k: k.efficiency, default=None)
    return {"predicted_us": predicted.time_us, "measured": t["whole"],
            "paired": timing.Ratio(statistics.median(per_round), timing.percentile(per_round, 10),
                                   timing.percentile(per_round, 90), (10, 90)),
            "kernels": len(predicted.kernels), "distinct": len(distinct), "graphs": len(graphs),
            "roofline_kernels": sum(k.model == "roofline" for k in predicted.kernels),
            "kernel_ratios": list(ratios.values()), "furthest": furthest, "least": least,
            "roofline_us": cost.estimate(closed, hw="cpu").time_us}


def _tuned() -> list:
    """(name, factory) of the models the model was tuned on (``MODELS``)."""
    return [(name, _factory(file, factory, kwargs), in_quick)
            for name, file, factory, kwargs, in_quick in MODELS]


def _unseen() -> list:
    """(name, factory) of models from libraries and architectures it was not tuned on
    (``_here_models_unseen.py``): their figures are ``here_unseen_*``."""
    from benchmarks._here_models_unseen import MODELS as UNSEEN, QUICK

    return [(name, factory, name in QUICK) for name, factory in UNSEEN.items()]


def whole_models(quick: bool, cache_dir: Path, *, unseen: bool = False) -> tuple[dict, list]:
    model = OperatorModel(cache_dir / "operators.json", budget_s=600.0)
    rounds = 3 if quick else 9
    prefix = "here_unseen_" if unseen else "here_"
    figures, notes, worst = {}, [], []
    for name, make, in_quick in (_unseen() if unseen else _tuned()):
        if quick and not in_quick:
            continue
        print(f"[bench passes] here: {name}", file=sys.stderr, flush=True)
        with jax.enable_x64(False):  # users' models, under JAX's defaults
            with building():
                f, args = make()
            closed = ir.trace(f, *args)
            inputs = ir.partition(tuple(args), scalars=False)[0]
            t0 = time.perf_counter()
            acc = paired_accuracy(closed, inputs, model, rounds)
            seconds = time.perf_counter() - t0
        r, ks = acc["paired"], acc["kernel_ratios"]
        within = sum(0.5 <= x <= 2.0 for x in ks) / len(ks) if ks else None  # none timed alone
        worst.append(max(ks + [1 / x for x in ks], default=1.0))
        figures.setdefault(f"{prefix}predicted_over_measured_ratio", {})[name] = r.to_dict()
        figures.setdefault(f"{prefix}kernels_within_2x_fraction", {})[name] = within
        if unseen:
            figures.setdefault("here_unseen_cpu_roofline_over_measured_ratio", {})[name] = (
                acc["roofline_us"] / acc["measured"].median_us)
        unpaired = acc["predicted_us"] / acc["measured"].median_us
        far = acc["furthest"]
        furthest = ("" if far is None else
                    f" (furthest: {far[0]}, {far[1]:.4g} µs cached vs {far[2]:.4g} µs alone)")
        k = acc["least"]
        least = ("" if k is None else
                 f"; least efficient kernel {k.name} ({', '.join(k.in_shapes)}): "
                 f"{k.run_us:.4g} µs measured over {k.bound_us:.3g} µs roofline = "
                 f"×{k.efficiency:.3g}")
        notes.append(
            f"here, {name}: {acc['kernels']} kernels ({acc['distinct']} distinct timed, "
            f"{acc['graphs']} XLA graphs of several timed whole, "
            f"{acc['roofline_kernels']} on the roofline), predicted {acc['predicted_us']:.4g} µs "
            f"(the 'cpu' roofline: {acc['roofline_us']:.4g} µs), jax.jit "
            f"{acc['measured'].summary()}: predicted/measured {r.median:.3g} [p10–p90 "
            f"{r.low:.3g}–{r.high:.3g}] paired over {rounds} rounds, {unpaired:.3g} from the "
            f"cache; " + (f"kernels' cached time over alone in the rounds {min(ks):.3g}–"
                          f"{max(ks):.3g}, {within:.0%} within 0.5–2×" if ks else
                          "no kernel timed alone in the rounds") +
            f"{furthest}{least} ({seconds:.0f} s)")
        print(f"[bench passes] {notes[-1]}", file=sys.stderr, flush=True)
    if worst:  # none in --quick's tuned set
        figures[f"{prefix}kernel_worst_ratio"] = max(worst)
    return figures, notes


def _inspect_seconds(target: str, hw: str, env: dict) -> float:
    cmd = [sys.executable, "-m", "mlsys_jax.cli", "inspect", target, "--hw", hw, "--json"]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-300:]}")
    return time.perf_counter() - t0


def cache_reuse(cache_dir: Path, target: str = "examples/flax_resnet.py:inspect",
                rounds: int = 5) -> tuple[dict, list]:
    """``inspect TARGET --hw here`` (its kernels cached by a first run) beside ``inspect --hw
    cpu``, after a first run of each (calibrating the CPU, measuring the kernels)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_dir), "PYTHONPATH": str(ROOT),
           "KERAS_BACKEND": "jax"}
    first = {hw: _inspect_seconds(target, hw, env) for hw in ("cpu", "here")}
    pairs = []
    for _ in range(rounds):
        pairs.append(_inspect_seconds(target, "here", env) / _inspect_seconds(target, "cpu", env))
    r = timing.Ratio(statistics.median(pairs), min(pairs), max(pairs))
    note = (f"a second run reuses the cache: `inspect {target} --hw here` over `--hw cpu`, fresh "
            f"processes, {rounds} paired rounds: {r.median:.3g} [{r.low:.3g}–{r.high:.3g}] "
            f"(target < 1.2); the first run measured its kernels in {first['here']:.1f} s "
            f"({first['cpu']:.1f} s for --hw cpu, calibrating)")
    return {"here_cached_inspect_over_cpu_time_ratio": r.to_dict()}, [note]


def _reachable(start, depth: int) -> list:
    """Graphs the search's moves reach from ``start`` in up to ``depth`` steps (distinct)."""
    from mlsys_jax.passes import registry

    seen, frontier, found = {ir.structural_hash(start)}, [start], []
    for _ in range(depth):
        nxt = []
        for g in frontier:
            for entry in registry.search_moves().values():
                for k in range(entry.candidates(g)):
                    res = entry.move(k)(g)
                    h = ir.structural_hash(res.jaxpr)
                    if res.changed and h not in seen:
                        seen.add(h)
                        nxt.append(res.jaxpr)
        found += nxt
        frontier = nxt
    return found


def search_pick(name: str, closed, inputs, model: OperatorModel, rounds: int) -> tuple[int, str]:
    from mlsys_jax import passes as P
    from mlsys_jax.passes.registry import pipeline as default_pipeline
    from mlsys_jax.passes.search import search

    found = search(closed, hw=here_hardware(model), dtype=None)
    start = P.run(default_pipeline(), closed, verify=True, cost=False).jaxpr
    graphs = {"original": closed, "pipeline": start}
    graphs.update({f"reached {i}": g for i, g in enumerate(_reachable(start, 2))})
    picked = ir.structural_hash(found.best)
    others = {k: g for k, g in graphs.items() if ir.structural_hash(g) != picked}
    from mlsys_jax.cost.measure import time_graphs

    t = time_graphs({**others, "picked": found.best}, inputs, repeats=rounds, best_of=2)
    fastest = min(others, key=lambda k: t[k].median_s)
    ok = t["picked"].median_s <= 1.05 * t[fastest].median_s
    rules = " → ".join(s.rule for s in found.path) or "the original"
    return int(ok), (f"search --hw here on {name}: picked {rules} (predicted "
                     f"{found.best_cost['time_us']:.4g} µs, measured {t['picked'].summary()}) "
                     f"among {len(others) + 1} graphs timed side by side ({rounds} rounds); "
                     f"fastest other: {fastest} {t[fastest].summary()}; the pick is the fastest "
                     f"within 5%: {'yes' if ok else 'no'}")


def search_picks(quick: bool, cache_dir: Path) -> tuple[dict, list]:
    from benchmarks._resnet_block import block_graphs

    model = OperatorModel(cache_dir / "operators.json", budget_s=600.0)
    rounds = 5 if quick else 11
    _, graphs, x = block_graphs(quick)
    picks = {"resnet_block": search_pick("the §4.2 block", graphs["original"], [x], model,
                                         rounds)}
    if quick:  # the smallest case: the block alone
        return _picks_figures(picks)
    with jax.enable_x64(False):
        with building():
            apply, (variables, image) = _factory("flax_resnet.py", "inspect", {})()
        closed = ir.trace(partial(apply, variables), image)
        picks["flax_resnet"] = search_pick("the flax ResNet", closed, [image], model, rounds)
    return _picks_figures(picks)


def _picks_figures(picks: dict) -> tuple[dict, list]:
    figures = {"here_search_picks_fastest": int(all(ok for ok, _ in picks.values())),
               "here_search_picks_fastest_by_model": {k: ok for k, (ok, _) in picks.items()}}
    return figures, [note for _, note in picks.values()]


def _reuse_and_cold(quick: bool, cache_dir: Path) -> tuple[dict, list]:
    """Items 2 and 5 (``--quick``: item 5 alone, one round)."""
    from benchmarks._here_cold import cold_ratio

    if quick:
        return cold_ratio(rounds=1)
    reuse, cold = cache_reuse(cache_dir), cold_ratio(rounds=5)
    return {**reuse[0], **cold[0]}, reuse[1] + cold[1]


def run(quick: bool = False) -> tuple[dict, list]:
    figures, notes = {}, []
    with tempfile.TemporaryDirectory(prefix="mlsys-jax-here-") as tmp:
        for part in (whole_models(quick, Path(tmp)),
                     whole_models(quick, Path(tmp), unseen=True),
                     search_picks(quick, Path(tmp)), _reuse_and_cold(quick, Path(tmp))):
            figures.update(part[0])
            notes += part[1]
    return figures, notes
