"""``mlsys-jax remat FILE.py:FN --budget BYTES|PCT% [--json] [--plot OUT.png]`` (lecture §7.2).

FN is an example factory returning ``(loss_fn, params, batch)``; the gradient is taken with
respect to ``params`` only. The plan is chosen on the compiled program (``remat.Frontier``): the
budget is XLA's temp bytes, ``PCT%`` of no remat's. Printed: the plan (saved and recomputed
values), its predicted peak, the compiled temp bytes and FLOPs, the step time ratio to no remat
(measured side by side), the gradients' max |Δ| against ``jax.grad``, and the same figures for
JAX's built-in policies with the planner's plan at each policy's temp bytes. The user's model runs
under JAX's defaults (float32), as it would in their own code.
"""
from __future__ import annotations

import json

from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch)"
JSON_KEYS = ("budget_bytes", "predicted_peak_bytes", "compiled_temp_bytes", "compiled_flops",
             "step_time_ratio", "grads_max_abs_diff", "saved", "recomputed", "policies")


HELP = "plan recomputation for a model's loss under a memory budget; compare with JAX's policies"


def add_arguments(p) -> None:
    p.add_argument("target", metavar="FILE.py:FN",
                   help="a factory returning (loss_fn, params, batch)")
    p.add_argument("--budget", required=True, metavar="BYTES|PCT%",
                   help="XLA temp bytes for the gradient, or a percentage of no remat's")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png", help="memory–time plot (needs the plot extra)")
    p.add_argument("--repeats", type=int, default=7, help="timing rounds (default 7)")


def load_factory(target: str):
    """The shared loader (``cli.target.load_factory``): ``(loss_fn, params, batch)``, with arrays
    among the parameters."""
    import jax

    from mlsys_jax.cli.target import load_factory as load

    loss_fn, params, batch = load(target, FORM)
    if not jax.tree_util.tree_leaves(params):
        raise MlsysError(f"{target}: params (the second value) has no arrays; return the "
                         "model's parameters, e.g. model.init(key, x)")
    return loss_fn, params, batch


def report(target: str, budget, repeats: int = 7) -> dict:
    """Plan at ``budget`` and measure it beside no remat and JAX's built-in policies."""
    import jax

    from mlsys_jax.remat.milp import plan_key
    from mlsys_jax.remat.planner.measure import grad_difference
    from mlsys_jax.remat.planner.budget import parse_budget
    from mlsys_jax.remat.planner.frontier import Frontier
    from mlsys_jax.remat.planner.policies import versus_policies

    if not isinstance(repeats, int) or repeats < 1:
        raise MlsysError(f"--repeats must be a positive int, got {repeats!r}")
    parse_budget(budget)                                   # a bad budget fails before any work
    frontier = Frontier(*load_factory(target))
    chosen = frontier.plan(budget)
    flat, args = frontier.flat, (frontier.flat.diff, frontier.flat.batch)
    grads = frontier.compiled[plan_key(chosen)](*args)
    reference = jax.jit(jax.grad(flat.fn, argnums=0))(*args)
    versus = versus_policies(frontier, repeats)
    ratio = next(q["step_time_ratio"] for q in versus["frontier"]
                 if plan_key(q["plan"]) == plan_key(chosen))
    return {"budget_bytes": chosen.budget_bytes,
            "predicted_peak_bytes": chosen.predicted_peak_bytes,
            "compiled_temp_bytes": chosen.compiled_temp_bytes,
            "compiled_flops": chosen.compiled_flops, "step_time_ratio": ratio,
            "grads_max_abs_diff": grad_difference(grads, reference)[0],
            "saved": list(chosen.saved), "recomputed": list(chosen.recomputed),
            "policies": versus["policies"],
            "_extra": {"plan": chosen, "frontier": frontier, "versus": versus}}


def _names(graph, names, limit=10) -> str:
    shape = dict(zip(graph.names, graph.shapes))
    shown = [f"{n} {shape.get(n, '')}".strip() for n in names[:limit]]
    more = f", … ({len(names) - limit} more; --json lists all)" if len(names) > limit else ""
    return (", ".join(shown) + more) or "(none)"


def print_text(target: str, out: dict) -> None:
    from mlsys_jax.tables import format_table

    extra = out["_extra"]
    p, fr = extra["plan"], extra["frontier"]
    base = fr.no_remat
    print(f"remat {target}: budget {out['budget_bytes']} bytes of XLA temp "
          f"(no remat: {base.compiled_temp_bytes}; least of any plan: {fr.min_budget_bytes})")
    print(f"plan: {len(p.segments)} segment(s), {len(p.saved)} saved, {len(p.recomputed)} "
          f"recomputed ({p.recompute_flops} FLOPs predicted); {p.method}, optimality gap "
          f"{p.optimality_gap:.2%}; {len(fr.measured)} plans compiled, {len(fr.points)} on the "
          f"frontier; pinned (kept from XLA's CSE): "
          f"{'the whole segment backward' if p.pin == 'backward' else 'the recomputation'}")
    print(f"  saved:      {_names(fr.graph, p.saved)}")
    print(f"  recomputed: {_names(fr.graph, p.recomputed)}")
    rows = [{"figure": "predicted peak bytes (backward's residuals)",
             "plan": p.predicted_peak_bytes, "no remat": base.predicted_peak_bytes},
            {"figure": "compiled temp bytes", "plan": p.compiled_temp_bytes,
             "no remat": base.compiled_temp_bytes},
            {"figure": "compiled FLOPs", "plan": p.compiled_flops, "no remat": base.compiled_flops},
            {"figure": "step time ratio (to no remat)", "plan": out["step_time_ratio"],
             "no remat": 1.0},
            {"figure": "grads max |Δ| vs jax.grad", "plan": out["grads_max_abs_diff"],
             "no remat": 0.0}]
    print(format_table(rows, title="\n[the plan, compiled]"))
    print(format_table([{k: m[k] for k in m} for m in extra["versus"]["matched"]],
                       title="\n[JAX's built-in policies, jax.checkpoint(loss_fn, policy=...), "
                             "beside the plan at each policy's compiled temp bytes]"))


def write_plot(path: str, out: dict) -> str:
    from mlsys_jax.viz import plots

    versus, p = out["_extra"]["versus"], out["_extra"]["plan"]
    front = versus["frontier"]
    series = {"planner (compiled frontier)": ([q["compiled_temp_bytes"] for q in front],
                                              [q["step_time_ratio"] for q in front])}
    series.update({pol["name"]: ([pol["compiled_temp_bytes"]], [pol["step_time_ratio"]])
                   for pol in versus["policies"]})
    series["chosen plan"] = ([p.compiled_temp_bytes], [out["step_time_ratio"]])
    written = plots.lines(path, series, xlabel="XLA temp bytes of the gradient",
                          ylabel="step time / no remat", title="Recomputation: memory vs time")
    return f"plot written: {written}" if written else plots.unavailable_reason()


def main(args) -> int:
    import jax

    with jax.enable_x64(False):               # the user's model runs under JAX's defaults
        out = report(args.target, args.budget, args.repeats)
        note = write_plot(args.plot, out) if args.plot else None
    if args.json:
        print(json.dumps({k: out[k] for k in JSON_KEYS}, indent=1))
    else:
        print_text(args.target, out)
        if note:
            print(note)
    return 0
