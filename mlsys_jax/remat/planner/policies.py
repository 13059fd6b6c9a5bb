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

The report (``distinct``) compiles the policies for their figures first (``Programs.compile``'s
``quick``) and times only those that could matter: a policy that compiles to no remat's temp
bytes or more saves nothing (on XLA:CPU most do), one over the budget is no answer to it (and
timing it beside the plan takes rounds of seconds-long steps: docs/remat.md), and of policies
with the same temp bytes only
the one with the fewest compiled FLOPs is timed; the rest are listed with the reason, not timed.
"""
from __future__ import annotations

import jax

from mlsys_jax import timing
from mlsys_jax.remat.milp import plan_key
from mlsys_jax.remat.planner.budget import percent
from mlsys_jax.remat.planner.frontier import Frontier

BUILTIN_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
                    "dots_with_no_batch_dims_saveable", "checkpoint_dots")


def policy_programs(frontier: Frontier, *, quick: bool = False) -> dict:
    """name -> the compiled ``Program`` of ``jax.checkpoint(loss_fn, policy=name)`` (``quick``:
    compiled for XLA's figures only; ``Programs.full`` compiles one to be timed). The loss is
    the one traced already (``FlatLoss.replay``): the user's Python does not run again, and the
    module is the same (``name`` equations included, which names policies read)."""
    programs, out, seen = frontier.programs, {}, {}
    what = " for their temp bytes" if quick else ""
    frontier.progress.stage(f"compiling JAX's {len(BUILTIN_POLICIES)} built-in policies{what}")
    for k, name in enumerate(BUILTIN_POLICIES, 1):
        frontier.progress.item(k, len(BUILTIN_POLICIES), name)
        policy = getattr(jax.checkpoint_policies, name)
        if policy in seen:      # another name of one policy (checkpoint_dots is dots_saveable)
            out[name] = programs.alias(name, out[seen[policy]])
            continue
        seen[policy] = name
        out[name] = programs.compile(name, jax.checkpoint(frontier.flat.replay, policy=policy),
                                     quick=quick)
    return out


def distinct(frontier: Frontier, built: dict, *, budget_bytes: int | None = None
             ) -> tuple[dict, dict]:
    """(name -> Program worth timing, name -> why another is not timed): no fewer temp bytes than
    no remat's saves nothing; more than ``budget_bytes`` (the report's budget) is no answer to it
    and, larger than every plan that fits, cannot be the smaller-and-faster of a pair with one;
    the same temp bytes as another policy, with no fewer FLOPs (the first in
    ``BUILTIN_POLICIES`` order on a tie), is that one's point of the frontier again."""
    base = frontier.no_remat.compiled_temp_bytes
    timed, skipped = {}, {}
    for name, prog in built.items():
        if prog.temp_bytes >= base:
            same = "the same temp bytes as" if prog.temp_bytes == base else "more temp bytes than"
            skipped[name] = f"compiles to {same} no remat: not timed"
            continue
        if budget_bytes is not None and prog.temp_bytes > budget_bytes:
            pct = 100 * budget_bytes / base
            skipped[name] = (f"compiles to {percent(prog.temp_bytes, base, pct)} of no remat's "
                             f"temp bytes, over the budget ({percent(budget_bytes, base, pct)}): "
                             "not timed")
            continue
        twin = next((n for n, q in built.items() if n != name and q.temp_bytes ==
                     prog.temp_bytes and (q.flops, BUILTIN_POLICIES.index(n)) <
                     (prog.flops, BUILTIN_POLICIES.index(name))), None)
        if twin is not None:
            skipped[name] = f"compiles to the same temp bytes as {twin}: not timed"
        else:
            timed[name] = prog
    return timed, skipped


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


def compare_policies(frontier: Frontier, built: dict, times: dict, plans,
                     skipped: dict | None = None) -> dict:
    """The policies ``built`` (name -> Program) beside the fastest of ``plans`` within each one's
    compiled temp bytes, from one timing session's ``times`` (label -> Timing); those in
    ``skipped`` (name -> why, ``distinct``) were not timed and get no verdict, only the reason.

    Returns ``{"policies": [...], "plans": [...], "matched": [...]}`` with compiled temp bytes,
    compiled FLOPs and step time ratios (to no remat, paired) for every program (``plans``: each
    of ``plans``, dominated ones included; ``Frontier.points`` is the frontier).
    """
    base, skipped = times[frontier.programs.reference.label], skipped or {}
    policies = [{"name": name, "compiled_temp_bytes": prog.temp_bytes,
                 "compiled_flops": prog.flops,
                 "step_time_ratio": None if name in skipped else
                 timing.ratio(times[name], base).median}
                for name, prog in built.items()]
    points = [{"plan": p, "compiled_temp_bytes": p.compiled_temp_bytes,
               "compiled_flops": p.compiled_flops, "step_time_ratio": frontier.step_time_ratio(p)}
              for p in sorted(plans, key=lambda p: p.compiled_temp_bytes)]
    matched = []
    for pol in policies:
        if pol["name"] in skipped:
            matched.append(_not_timed(pol, skipped[pol["name"]]))
            continue
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


def _not_timed(pol: dict, why: str) -> dict:
    """The ``matched`` row of a policy that was not timed: its figures and the reason."""
    return {"policy": pol["name"], "plan": None, "policy_temp_bytes": pol["compiled_temp_bytes"],
            "policy_flops": pol["compiled_flops"], "policy_step_time_ratio": None,
            "plan_temp_bytes": None, "plan_flops": None, "plan_step_time_ratio": None,
            "plan_over_policy_step_time_ratio": None, "plan_recomputed": None,
            "not_dominated": None, "why": why}
