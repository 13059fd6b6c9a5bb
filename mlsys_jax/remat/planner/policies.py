"""JAX's built-in checkpoint policies beside the planner, on the compiled program (lecture §7.2).

Each built-in policy is applied as a user applies it to a whole loss, ``jax.checkpoint(loss_fn,
policy=...)``, and compiled like every plan (``jax.grad`` with respect to the parameters only).
Measured on XLA:CPU: the recomputation a policy asks for is merged back into the forward pass
(the CPU pipeline drops the optimization barrier before CSE), so policies move temp bytes only
through XLA's fusion decisions. For each policy, the planner's plan at that policy's compiled
temp bytes must have no more compiled FLOPs: then no built-in policy dominates the planner.
Step times are measured side by side (``timing.compare``, interleaved rounds) as paired ratios
to no remat (the median over rounds of the two times in the same round).
"""
from __future__ import annotations

import jax

from mlsys_jax import timing
from mlsys_jax.remat.milp import plan_key
from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.remat.planner.measure import compile_grad

BUILTIN_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
                    "dots_with_no_batch_dims_saveable", "checkpoint_dots")


def policy_programs(frontier: Frontier) -> dict:
    """name -> (compiled gradient, compiled temp bytes, compiled FLOPs) for each built-in."""
    flat = frontier.flat
    return {name: compile_grad(jax.checkpoint(flat.fn, policy=getattr(jax.checkpoint_policies,
                                                                       name)), flat)
            for name in BUILTIN_POLICIES}


def step_time_ratios(frontier: Frontier, programs: dict, repeats: int = 7) -> dict:
    """name -> step time / no remat's (paired), all timed in the same interleaved rounds."""
    args = (frontier.flat.diff, frontier.flat.batch)
    fns = {name: (lambda c=c: c(*args)) for name, c in programs.items()}
    base = frontier.compiled[plan_key(frontier.no_remat)]
    fns["no remat"] = lambda: base(*args)
    times = timing.compare(fns, repeats=repeats, min_time_s=0.02)
    return {name: timing.ratio(t, times["no remat"]).median for name, t in times.items()}


def versus_policies(frontier: Frontier, repeats: int = 7) -> dict:
    """Built-in policies, the frontier, and the plan at each policy's compiled temp bytes.

    Returns ``{"policies": [...], "frontier": [...], "matched": [...]}`` with compiled temp
    bytes, compiled FLOPs and step time ratios (to no remat) for every program.
    """
    built = policy_programs(frontier)
    programs = {name: c for name, (c, _, _) in built.items()}
    for k, p in enumerate(frontier.points):
        if plan_key(p) != plan_key(frontier.no_remat):
            programs[f"plan {k}"] = frontier.compiled[plan_key(p)]
    ratio = step_time_ratios(frontier, programs, repeats)
    ratio.update({f"plan {k}": 1.0 for k, p in enumerate(frontier.points)
                  if plan_key(p) == plan_key(frontier.no_remat)})     # the same program
    policies = [{"name": name, "compiled_temp_bytes": temp, "compiled_flops": flops,
                 "step_time_ratio": ratio[name]} for name, (_, temp, flops) in built.items()]
    points = [{"plan": p, "compiled_temp_bytes": p.compiled_temp_bytes,
               "compiled_flops": p.compiled_flops, "step_time_ratio": ratio[f"plan {k}"]}
              for k, p in enumerate(frontier.points)]
    matched = []
    for pol in policies:
        fits = [q for q in points if q["compiled_temp_bytes"] <= pol["compiled_temp_bytes"]]
        q = fits[-1] if fits else None     # the fewest FLOPs that fit (the frontier's order)
        matched.append({
            "policy": pol["name"], "policy_temp_bytes": pol["compiled_temp_bytes"],
            "policy_flops": pol["compiled_flops"], "policy_step_time_ratio": pol["step_time_ratio"],
            "plan_temp_bytes": q and q["compiled_temp_bytes"],
            "plan_flops": q and q["compiled_flops"],
            "plan_step_time_ratio": q and q["step_time_ratio"],
            "plan_recomputed": q and len(q["plan"].recomputed),
            "not_dominated": bool(q and q["compiled_flops"] <= pol["compiled_flops"])})
    return {"policies": policies, "frontier": points, "matched": matched}
