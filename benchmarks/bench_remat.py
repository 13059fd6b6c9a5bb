"""Rematerialization (lecture §7.2): K = √N checkpointing vs store-all, MILP solve times, the
planner against JAX's built-in policies on a user's model, and `remat` at GPT-2 small's size beside
one compile of its step (``_remat_gpt2``); the least-memory plans of third-party nets as shipped
(not in ``--quick``).

Step time (jitted gradient) of the N = 64 tanh chain with every-√N checkpoints over store-all is a
paired ratio from one interleaved comparison (lecture §7.2: about one extra forward, ≈ 1.3× a
step); the XLA temp-memory ratio comes from the same compiled programs. Solve times are seconds
on this machine (the runner records its context): experiment 03's two-stage MILP for graphs of
~50, ~200, ~500 values, and the segmented planner (every candidate segmentation, the least budget
and a mid budget) on a generated 5,000-value graph. Against the built-ins: every program's
compiled temp bytes and FLOPs, and paired step time ratios to no remat, timed side by side.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import building
from benchmarks._remat_gpt2 import gpt2_figures
from mlsys_jax import timing
from mlsys_jax.remat import every_k, store_all
from mlsys_jax.remat.chain.jax_exec import chain_loss

NAME = "remat"


def _chain_figures(n: int, width: int, batch: int, repeats: int) -> tuple[dict, list[str]]:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, width)), dtype=jnp.float32)
    ws = jnp.asarray(rng.standard_normal((n, width, width)) / np.sqrt(width), dtype=jnp.float32)
    k = round(math.sqrt(n))
    compiled = {name: jax.jit(jax.grad(chain_loss(s))).lower(ws, x).compile()
                for name, s in (("store_all", store_all(n)), (f"every_{k}", every_k(n, k)))}
    temp = {name: c.memory_analysis().temp_size_in_bytes for name, c in compiled.items()}
    t = timing.compare({name: (lambda c=c: c(ws, x)) for name, c in compiled.items()},
                       repeats=repeats)
    figures = {f"every_{k}_over_store_all_step_time_ratio":
               timing.ratio(t[f"every_{k}"], t["store_all"]).to_dict(),
               f"every_{k}_over_store_all_xla_temp_ratio": temp[f"every_{k}"] / temp["store_all"]}
    notes = [f"chain N={n}, h' = tanh(h W), float32 {batch}x{width} activations, jitted "
             f"jax.grad; K={k} is scan(checkpoint(scan(layer))); {repeats} interleaved rounds; "
             f"XLA temp bytes: store-all {temp['store_all']}, every-{k} {temp[f'every_{k}']}; "
             f"store-all step median {t['store_all'].median_us:.0f} µs"]
    return figures, notes


def _milp_figures(sizes, repeats: int) -> tuple[dict, list[str]]:
    from experiments.s03_remat.milp import gated_residual_mlp, graph_inputs
    from mlsys_jax.remat.two_stage import problem

    figures, notes = {}, []
    for target in sizes:
        blocks = max(1, round((target - 3) / 10))     # a gated block adds 10 values
        ws, x = graph_inputs(blocks, width=16, batch=8)
        prob = problem(gated_residual_mlp, ws, x)
        free = prob.solve(2**62)
        budget = (prob.arg_bytes + free.predicted_peak_bytes) // 2
        secs = sorted(prob.solve(budget).solve_seconds for _ in range(repeats))
        figures[f"milp_solve_ms_{len(prob.names)}_values"] = 1e3 * secs[len(secs) // 2]
        notes.append(f"MILP {len(prob.names)} values ({blocks} blocks, {2 * len(prob.names)} "
                     f"binaries): median {1e3 * secs[len(secs) // 2]:.1f} ms over {repeats} solves "
                     f"(min {1e3 * secs[0]:.1f}, max {1e3 * secs[-1]:.1f}) at the mid budget")
    return figures, notes


def _planner_scale(values: int) -> tuple[dict, list[str]]:
    """The segmented planner on a gated residual MLP of ``values`` values (10 per block)."""
    from experiments.s03_remat.milp import gated_residual_mlp, graph_inputs
    from mlsys_jax.remat.planner.segments import problem

    ws, x = graph_inputs(max(1, values // 10), width=16, batch=8)
    with jax.enable_x64(False):
        t0 = time.perf_counter()
        prob = problem(gated_residual_mlp, ws.astype(np.float32), x.astype(np.float32))
        build, t0 = time.perf_counter() - t0, time.perf_counter()
        least = prob.min_peak_budget_bytes
        least_s = time.perf_counter() - t0
        mid = prob.solve((least + prob.store_all_bytes) // 2)
    n = prob.graph.n_values
    figures = {f"planner_{n}_values_min_budget_s": least_s,
               f"planner_{n}_values_mid_budget_s": mid.solve_seconds,
               f"planner_{n}_values_mid_budget_gap": mid.optimality_gap}
    notes = [f"segmented planner, {n} values ({len(prob.tmp_eqns)} JVP bundles, {len(prob.cuts)} "
             f"segmentations K = {', '.join(str(len(c)) for c in prob.cuts)}): graph + MILP "
             f"build {build:.1f} s; least budget {least} B in {least_s:.1f} s; mid budget "
             f"{mid.peak_budget_bytes} B in {mid.solve_seconds:.1f} s ({mid.method}, "
             f"K={len(mid.segments)}, gap {mid.optimality_gap:.2%})"]
    return figures, notes


@contextlib.contextmanager
def _examples_on_path():
    """``examples/`` importable (its factories are modules of that folder, not a package)."""
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    sys.path.insert(0, examples)
    try:
        yield
    finally:
        sys.path.remove(examples)


def _versus_builtins(module_name: str, repeats: int) -> tuple[dict, list[str]]:
    """The planner's compiled frontier against jax.checkpoint(loss, policy) for each built-in."""
    from mlsys_jax.remat.planner.frontier import LADDER, Frontier
    from mlsys_jax.remat.planner.policies import versus_policies

    with _examples_on_path(), jax.enable_x64(False):
        module = __import__(module_name)
        with building():
            built = module.loss()
        t0 = time.perf_counter()
        frontier = Frontier(*built, ladder=LADDER)
        build = time.perf_counter() - t0
        versus = versus_policies(frontier, repeats=repeats)
    figures = {}
    for m in versus["matched"]:
        figures[f"{module_name}.{m['policy']}"] = {
            k: m[k] for k in ("policy_temp_bytes", "policy_flops", "policy_step_time_ratio",
                              "plan_temp_bytes", "plan_flops", "plan_step_time_ratio",
                              "plan_over_policy_step_time_ratio", "not_dominated")}
    figures[f"{module_name}.frontier"] = [      # the timed frontier: none larger and slower
        {"compiled_temp_bytes": p.compiled_temp_bytes, "compiled_flops": p.compiled_flops,
         "step_time_ratio": frontier.step_time_ratio(p)} for p in frontier.points]
    notes = [f"{module_name}: {len(frontier.measured)} plans compiled in {build:.0f} s, "
             f"{len(frontier.points)} on the timed frontier (compiled temp bytes, measured step "
             f"time); policies as jax.checkpoint(loss_fn, policy=...), timed in the same rounds; "
             f"step time ratios are paired (median over at most {repeats} interleaved rounds of "
             f"each program's time over no remat's, or the plan's over the policy's, in the same "
             f"round); not_dominated: the plan within the policy's bytes is not slower in every "
             f"round"]
    return figures, notes


def _least_on_shipped() -> tuple[dict, list[str]]:
    """`--budget min` on third-party nets as shipped (examples/shipped_nets.py): the planner's
    minimum against store-all, and the least-memory plan compiled beside no remat (not in
    ``--quick``)."""
    from mlsys_jax.remat.planner.frontier import Frontier

    figures, notes = {}, []
    with _examples_on_path():
        import shipped_nets
    for name in ("keras_mobilenet_v2", "equinox_vit"):
        with jax.enable_x64(False):
            with building():
                built = getattr(shipped_nets, name)()
            t0 = time.perf_counter()
            fr = Frontier(*built, repeats=3, timing_budget_s=5.0)
            least = fr.plan("min")
            seconds = time.perf_counter() - t0
        prob, base = fr.problem, fr.no_remat.compiled_temp_bytes
        rel = fr.program(least).grads_max_rel_diff
        figures[name] = {
            "min_over_store_all_predicted_ratio": prob.min_peak_budget_bytes / prob.store_all_bytes,
            "least_over_no_remat_temp_ratio": least.compiled_temp_bytes / base,
            "least_step_time_ratio": fr.step_time_ratio(least),
            "least_grads_max_rel_diff": rel}
        notes.append(f"{name} ({fr.graph.n_eqns} equations): predicted minimum "
                     f"{prob.min_peak_budget_bytes} B of store-all's {prob.store_all_bytes} B; "
                     f"the least-memory plan ({len(least.recomputed)} recomputed, "
                     f"{least.pin} pinned) compiles to {least.compiled_temp_bytes} B of no "
                     f"remat's {base} B; {len(fr.measured)} programs compiled, "
                     f"{seconds:.0f} s after building the model")
    return figures, notes


def run(quick: bool = False) -> dict:
    figures, notes = _chain_figures(64, 64 if quick else 256, 32 if quick else 128,
                                    5 if quick else 11)
    try:
        import scipy  # noqa: F401
    except ImportError:
        return {"figures": figures,
                "notes": notes + ["MILP solve times skipped: scipy is not installed ('solver' extra)"]}
    mf, mn = _milp_figures((50, 200) if quick else (50, 200, 500), 3 if quick else 5)
    figures.update(mf)
    notes += mn
    parts = [(_planner_scale, (500 if quick else 5000,)),
             (_versus_builtins, ("flax_mlp" if quick else "flax_transformer", 5 if quick else 9)),
             *([] if quick else [(_least_on_shipped, ())]),
             (gpt2_figures, (quick,))]
    for part, args in parts:
        more, more_notes = part(*args)
        figures.update(more)
        notes += more_notes
    return {"figures": figures, "notes": notes}
