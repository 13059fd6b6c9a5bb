"""Graph passes: how fast the verified pipeline is, and what the §4.2 rewrite buys on CPU.

1. The default pipeline (fold_constants, cse, fold_conv_bn, merge_parallel_convs, dce), verified
   after every pass, on a generated program of ~10,000 equations (duplicates, constant subgraphs
   and dead code in every block, so every pass fires) vs XLA compiling that same program; and the
   same at ~1,000 equations, for the scaling (10× the equations should cost ≤ 11× the CPU time).
2. XLA:CPU wall time of the §4.2 ResNet block before and after the five rewrites (jit, f32, same
   inputs), side by side, median of interleaved rounds.
3. The 'cpu' cost model against XLA:CPU (``benchmarks/_cpu_model.py``): calibrated bandwidth
   over NumPy's copy, and whether the estimate orders graphs as the measurement does.
4. The search with ``measure`` on that block (``hw="cpu"``): the graph it picks, timed again beside
   the original and the five steps' graphs — its measured speedup and whether it is the fastest.
5. The structural passes against JAX's own dead-code elimination (``partial_eval.dce_jaxpr``) on
   the same ~10,000-equation program, paired rounds: ``cse``, ``dce``, ``cse``+``dce``, and the
   verified pipelines. The passes edit equation lists instead of re-tracing (``ir.edit``) and
   the verifier checks only what changed, so they cost a small multiple of one walk.
6. The fuzzer's CI tier (seed 0, every pass, gradients on every 2nd program) on a sample of
   programs: programs per second on this machine, and the share of its CPU time the passes take.
7. Translation validation's cost: the default pipeline with every rewrite validated on its region
   (``passes.run``'s default) and without, on the same program and on the §4.2 block.
8. The ``here`` measured-operator model (``benchmarks/_here_model.py``): predicted over measured
   on whole models, its kernels, a second run from the cache, and the search ranking by it.
9. Whole models with their parameters as constants (ResNet-50 at 224, GPT-2 small; the quick
   tier: their tiny configurations): the verified default pipeline, validated and unvalidated,
   against XLA compiling the same ResNet-50 graph, paired rounds
   (``_pass_speed.model_validation_cost``).
"""
from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import ir, timing
from mlsys_jax import passes as P
from mlsys_jax.passes.registry import pipeline as default_pipeline
from mlsys_jax.passes.search import search

from benchmarks._resnet_block import block_graphs

NAME = "passes"
EQNS_PER_BLOCK = 11


def generated_program(n_eqns: int, width: int = 64):
    """A traced chain of blocks with CSE, folding and DCE opportunities (~``n_eqns`` equations)."""
    blocks = max(1, n_eqns // EQNS_PER_BLOCK)
    table = jnp.asarray(np.random.default_rng(0).standard_normal((blocks, width)), jnp.float32)

    def f(x):
        for i in range(blocks):
            c = table[i]                      # constant slice: folded
            k = c * 2.0 + 1.0                 # constant subgraph: folded
            a = jnp.sin(x) * c
            b = jnp.sin(x) * c                # duplicate of a: CSE
            jnp.exp(a)                        # dead: DCE
            x = jnp.tanh(a + b + k)
        return x
    return ir.trace(f, jax.ShapeDtypeStruct((width,), jnp.float32))


def _compile(closed):
    structs = ir.input_structs(closed)
    return jax.jit(ir.as_function(closed)).lower(*structs).compile()  # a fresh function: no cache


def pipeline_scaling(pipeline, progs: dict, repeats: int) -> tuple[dict, dict]:
    """The verified pipeline on each program, the sizes interleaved round by round (load on this
    shared machine hits both alike), timed twice: in this process's CPU time (every thread's,
    XLA's eager kernels too), which other jobs cannot stretch by descheduling it — the scaling
    figure — and in wall time. One warm-up call per program: the first run at a size compiles the
    eager folding kernels for its constant table's shape. ``passes.run`` collects the young
    generation itself at its end, so no collection is deferred into the next round."""
    fns = {n: partial(P.run, pipeline, c, verify=True, cost=False) for n, c in progs.items()}
    cpu = timing.compare(fns, repeats=repeats, warmup=1, number=1, clock=time.process_time)
    wall = timing.compare(fns, repeats=repeats, warmup=0, number=1)
    return cpu, wall


def pipeline_vs_compile(quick: bool) -> tuple[dict, list]:
    repeats = 5 if quick else 11
    pipeline = default_pipeline()
    sizes = (200, 2_000) if quick else (1_000, 10_000)
    P.run(pipeline, generated_program(200), verify=True, cost=False)  # eager folding kernels compile
    progs = {n: generated_program(n) for n in sizes}
    t, wall = pipeline_scaling(pipeline, progs, repeats)
    rows = {}
    for n, closed in progs.items():
        res = P.run(pipeline, closed, verify=True, cost=False)
        comp = timing.time_once(lambda: _compile(closed))  # minutes at 10k eqns: measured once  # noqa: B023 (called in this iteration)
        rows[n] = {"eqns": len(closed.jaxpr.eqns), "eqns_after": len(res.jaxpr.jaxpr.eqns),
                   "pipeline": t[n], "wall": wall[n], "compile_s": comp,
                   "rewrites": len(res.rewrites)}
    small, big = sizes
    scale, wall_scale = timing.ratio(t[big], t[small]), timing.ratio(wall[big], wall[small])
    figures = {"pipeline_over_compile_ratio": wall[big].median_s / rows[big]["compile_s"],
               "pipeline_10x_eqns_time_ratio": scale.median,
               "pipeline_10x_eqns_wall_time_ratio": wall_scale.median,
               "compile_10x_eqns_time_ratio": rows[big]["compile_s"] / rows[small]["compile_s"]}
    notes = [f"{r['eqns']} equations → {r['eqns_after']} after {r['rewrites']} rewrites: pipeline "
             f"(verified after every pass) {r['pipeline'].median_s:.3g} s CPU "
             f"[{r['pipeline'].min_s:.3g}–{r['pipeline'].max_s:.3g}], {r['wall'].median_s:.3g} s "
             f"wall [{r['wall'].min_s:.3g}–{r['wall'].max_s:.3g}] (medians of {repeats}); "
             f"XLA compile {r['compile_s']:.3g} s (once, wall)" for r in rows.values()]
    eqns = rows[big]["eqns"] / rows[small]["eqns"]
    notes.append(f"{eqns:.3g}× the equations: pipeline CPU time × {scale.median:.3g} "
                 f"[{scale.low:.3g}–{scale.high:.3g}], wall time × {wall_scale.median:.3g} "
                 f"[{wall_scale.low:.3g}–{wall_scale.high:.3g}] (median of per-round ratios, "
                 f"{repeats} paired rounds each; CPU time is the figure: this process's, so other "
                 "jobs on the machine do not stretch it); targets: pipeline faster than XLA "
                 "compile (ratio < 1), 10× equations ≤ 11× CPU time")
    return figures, notes


def _jitted(graphs: dict, x) -> dict:
    return {k: partial(jax.jit(ir.as_function(g)), x) for k, g in graphs.items()}


def block_speedup(quick: bool) -> tuple[dict, list]:
    shape, graphs, x = block_graphs(quick)
    fns = _jitted(graphs, x)
    t = timing.compare(fns, repeats=5 if quick else 11)
    r = timing.ratio(t["original"], t["optimized"])
    worse = timing.ratio(t["enlarged"], t["folded"])
    figures = {"resnet_block_cpu_speedup_ratio": r.median,
               "resnet_block_cpu_enlarged_over_folded_ratio": worse.to_dict()}
    notes = [f"§4.2 block at {'×'.join(map(str, shape))} f32 on XLA:CPU: original "
             f"{t['original'].summary()}, optimized (conv3x3'+relu) {t['optimized'].summary()}; "
             f"speedup {r.median:.3g}× [{r.low:.3g}–{r.high:.3g}] (target ≥ 1.1×)",
             f"§4.2 step ③ is worse before better on XLA:CPU too (lecture claim, experiment 02): "
             f"enlarged (1×1 padded to 3×3) over folded {worse.median:.3g}× [{worse.low:.3g}–"
             f"{worse.high:.3g}], paired rounds (claim: > 1; measured 1.09–2.1× in single runs "
             "of experiment 02, too close to 1 for a check there)"]
    return figures, notes


def block_search_measured(quick: bool) -> tuple[dict, list]:
    """``search(..., hw="cpu", measure=k)`` on the §4.2 block: the graph it returns, timed again
    side by side with the original and the five steps' graphs: a search that never loses on the
    machine it runs on (TASO measures its operators)."""
    shape, graphs, x = block_graphs(quick)
    found = search(graphs["original"], hw="cpu", dtype=None, measure=4, repeats=5 if quick else 7)
    fns = _jitted({**graphs, "picked": found.best}, x)
    t = timing.compare(fns, repeats=5 if quick else 11)
    r = timing.ratio(t["original"], t["picked"])
    same = ir.structural_hash(found.best)  # a step's graph may be the pick itself: not "other"
    fastest_other = min(v.median_s for k, v in t.items()
                        if k != "picked" and ir.structural_hash(graphs[k]) != same)
    picks_fastest = t["picked"].median_s <= 1.05 * fastest_other  # within 5%: a tie is a tie
    figures = {"resnet_block_search_cpu_measured_speedup_ratio": r.to_dict(),
               "resnet_block_search_cpu_picks_fastest": int(picks_fastest)}
    rules = [s.rule for s in found.path]
    notes = [f"search --measure on the §4.2 block ({'×'.join(map(str, shape))} f32, hw=cpu): "
             f"picked {' → '.join(rules) or 'the original'} among {len(found.measured['candidates'])}"
             f" timed graphs in {found.seconds:.1f} s; timed again beside the original, folded, "
             f"enlarged and optimized graphs: speedup {r.median:.3g}× [{r.low:.3g}–{r.high:.3g}] "
             "(target ≥ 1.1×); fastest within 5%: " + ("yes" if picks_fastest else "no") +
             f" (picked {t['picked'].summary()}, fastest other {fastest_other * 1e6:.4g} µs)"]
    return figures, notes


def run(quick: bool = False) -> dict:
    from benchmarks import _cpu_model, _here_model, _pass_speed

    f1, n1 = pipeline_vs_compile(quick)
    f2, n2 = block_speedup(quick)
    f3, n3 = _cpu_model.run(quick)
    f4, n4 = block_search_measured(quick)
    f5, n5 = _pass_speed.structural_vs_jax_dce(generated_program, quick)
    f6, n6 = _pass_speed.fuzz_rate(quick)
    f7, n7 = _pass_speed.validation_cost(generated_program, lambda q: block_graphs(q)[1]["original"], quick)
    f8, n8 = _here_model.run(quick)
    f9, n9 = _pass_speed.model_validation_cost(_compile, quick)
    return {"figures": {**f1, **f2, **f3, **f4, **f5, **f6, **f7, **f8, **f9},
            "notes": n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9}


if __name__ == "__main__":
    from mlsys_jax import runtime

    runtime.configure()
    print(run())
