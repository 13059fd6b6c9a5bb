"""JAX's built-in checkpoint policies beside the planner, on compiled bytes and measured time.

Each built-in policy is applied as a user applies it to a whole loss, ``jax.checkpoint(loss_fn,
policy=...)``, and compiled like every plan (``jax.grad`` with respect to the parameters only;
policies that lower to the same module are one program). On XLA:CPU the recomputation a policy
asks for is merged back into the forward pass (the CPU pipeline drops the optimization barrier
before CSE), so policies move temp bytes only through XLA's fusion decisions. The policies are
timed in the same interleaved rounds as no remat and the plans, and each is set against the
fastest timed plan within its compiled temp bytes: the plan is reported as good as the policy
only if it is at least as small and not slower in every round (paired per round: the measured
noise), and as worse when it is slower in every round. FLOPs are shown, not judged.
"""
from __future__ import annotations

import jax

from mlsys_jax import timing
from mlsys_jax.remat.milp import plan_key
from mlsys_jax.remat.planner.frontier import Frontier

BUILTIN_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
                    "dots_with_no_batch_dims_saveable", "checkpoint_dots")


def policy_programs(frontier: Frontier) -> dict:
    """name -> the compiled ``Program`` of ``jax.checkpoint(loss_fn, policy=name)``."""
    flat, out = frontier.flat, {}
    frontier.progress.stage(f"compiling JAX's {len(BUILTIN_POLICIES)} built-in policies")
    for k, name in enumerate(BUILTIN_POLICIES, 1):
        frontier.progress.item(k, len(BUILTIN_POLICIES), name)
        policy = getattr(jax.checkpoint_policies, name)
        out[name] = frontier.programs.compile(name, jax.checkpoint(flat.fn, policy=policy))
    return out


def verdict(plan_over_policy: timing.Ratio | None) -> tuple[bool | None, str]:
    """(not dominated, why) from the paired plan / policy step time ratio (None: no plan)."""
    if plan_over_policy is None:
        return None, "no timed plan within the policy's temp bytes"
    r = plan_over_policy
    if r.low > 1:
        return False, f"policy faster: the plan took ×{r.median:.3g} its time in every round"
    if r.high < 1:
        return True, f"plan faster in every round (×{r.median:.3g} the policy's time)"
    return True, f"as fast within the noise (×{r.median:.3g}, rounds {r.low:.3g}–{r.high:.3g})"


def versus_policies(frontier: Frontier, plans=None, repeats: int | None = None) -> dict:
    """Built-in policies compiled and timed with ``plans`` (default: every compiled plan) in one
    session, then compared (``compare_policies``)."""
    if repeats is not None:
        frontier.repeats = repeats
    built = policy_programs(frontier)
    plans = list(frontier.measured if plans is None else plans)
    return compare_policies(frontier, built, frontier.time(plans, extra=built.values()), plans)


def compare_policies(frontier: Frontier, built: dict, times: dict, plans) -> dict:
    """The policies ``built`` (name -> Program) beside the fastest of ``plans`` within each one's
    compiled temp bytes, from one timing session's ``times`` (label -> Timing).

    Returns ``{"policies": [...], "plans": [...], "matched": [...]}`` with compiled temp bytes,
    compiled FLOPs and step time ratios (to no remat, paired) for every program (``plans``: each
    of ``plans``, dominated ones included; ``Frontier.points`` is the frontier).
    """
    base = times[frontier.programs.reference.label]
    policies = [{"name": name, "compiled_temp_bytes": prog.temp_bytes,
                 "compiled_flops": prog.flops,
                 "step_time_ratio": timing.ratio(times[name], base).median}
                for name, prog in built.items()]
    points = [{"plan": p, "compiled_temp_bytes": p.compiled_temp_bytes,
               "compiled_flops": p.compiled_flops, "step_time_ratio": frontier.step_time_ratio(p)}
              for p in sorted(plans, key=lambda p: p.compiled_temp_bytes)]
    matched = []
    for pol in policies:
        fits = [q for q in points if q["compiled_temp_bytes"] <= pol["compiled_temp_bytes"]]
        q = min(fits, key=lambda q: q["step_time_ratio"], default=None)
        ratio = q and timing.ratio(times[frontier.labels[plan_key(q["plan"])]], times[pol["name"]])
        ok, why = verdict(ratio)
        matched.append({
            "policy": pol["name"], "plan": q and frontier.labels[plan_key(q["plan"])],
            "policy_temp_bytes": pol["compiled_temp_bytes"],
            "policy_flops": pol["compiled_flops"], "policy_step_time_ratio": pol["step_time_ratio"],
            "plan_temp_bytes": q and q["compiled_temp_bytes"],
            "plan_flops": q and q["compiled_flops"],
            "plan_step_time_ratio": q and q["step_time_ratio"],
            "plan_over_policy_step_time_ratio": ratio and ratio.median,
            "plan_recomputed": q and len(q["plan"].recomputed),
            "not_dominated": ok, "why": why})
    return {"policies": policies, "plans": points, "matched": matched}
