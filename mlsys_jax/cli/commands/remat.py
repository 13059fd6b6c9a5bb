"""``mlsys-jax remat FILE.py:FN --budget BYTES|PCT%|min [--json] [--plot OUT.png]
[--trace OUT.json] [--quiet]``.

FN is an example factory returning ``(loss_fn, params, batch)`` — or the ``shard`` command's
``(loss_fn, params, batch, optimizer[, rules])``, whose optimizer and rules are ignored (said on
stderr) — and the gradient is taken with respect to ``params`` only. The plan is chosen on the
compiled program (``remat.Frontier``): the budget is XLA's temp bytes (``PCT%`` of no remat's,
``700MB``, ``min`` for the least any plan reaches); of the plans that fit, the fastest measured.
Printed: the plan (saved and recomputed values), its predicted peak, the compiled temp bytes and
FLOPs, the step time ratio to no remat (measured side by side, in rounds that stop once the choice
is settled: how many and why is printed), the gradients' max |Δ| against ``jax.grad``, and JAX's
built-in policies compiled, those that save temp bytes within the budget timed in the same rounds
beside the fastest plan within each policy's temp bytes (``--no-policies`` skips them). Progress goes to stderr (``--quiet``
silences it). The user's model runs under JAX's defaults (float32), as in their own code.
"""
from __future__ import annotations

import json
import sys

from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch[, optimizer[, rules]])"


def __getattr__(name):
    """``JSON_KEYS`` (the ``--json`` contract) is the library's; read lazily, since command modules
    import JAX only inside ``main``."""
    if name == "JSON_KEYS":
        from mlsys_jax.remat.planner.report import JSON_KEYS

        return JSON_KEYS
    raise AttributeError(name)


HELP = "plan recomputation for a model's loss under a memory budget; compare with JAX's policies"


def add_arguments(p) -> None:
    p.add_argument("target", metavar="FILE.py:FN",
                   help="a factory returning (loss_fn, params, batch[, optimizer])")
    p.add_argument("--budget", required=True, metavar="BYTES|PCT%|min",
                   help="XLA temp bytes for the gradient (2000000, 700MB, 1.5GiB), a percentage "
                        "of no remat's (60%%), or min (also 0): the least any plan reaches")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="OUT.png",
                   help="memory timeline of the plan and no remat (needs the plot extra)")
    p.add_argument("--trace", metavar="OUT.json",
                   help="the same timelines as Chrome trace counter tracks (open in "
                        "ui.perfetto.dev or chrome://tracing)")
    p.add_argument("--repeats", type=int, default=7, metavar="N",
                   help="timing rounds at most (default 7; fewer when steps are long, and "
                        "they stop once the choice is settled)")
    p.add_argument("--no-policies", action="store_true",
                   help="skip compiling and timing JAX's built-in policies")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def load_factory(target: str):
    """The shared loader (``cli.target.load_factory``): ``(loss_fn, params, batch)`` with arrays
    among the parameters, and a note when the factory also returned an optimizer (or rules)."""
    import jax

    from mlsys_jax.cli.target import load_factory as load
    from mlsys_jax.cli.target import target_name

    loss_fn, params, batch, optimizer, rules = load(target, FORM)
    if not jax.tree_util.tree_leaves(params):
        raise MlsysError(f"{target_name(target)}: params (the second value) has no arrays; "
                         "return the model's parameters, e.g. model.init(key, x)")
    extra = [name for name, v in (("optimizer", optimizer), ("partition rules", rules))
             if v is not None]
    one = len(extra) == 1
    note = (f"the factory's {' and '.join(extra)} {'is' if one else 'are'} ignored: remat plans "
            f"the gradient of loss_fn, which {'it does' if one else 'they do'} not change"
            ) if extra else None
    return (loss_fn, params, batch), note


def report(target: str, budget, *, repeats: int = 7, policies: bool = True, progress=None):
    """Load the factory and call the library's one entry (``remat.planner.report.plan_report``,
    which plans on shapes when the factory returned them); the budget and ``repeats`` are checked
    before the factory runs."""
    from mlsys_jax.progress import SILENT
    from mlsys_jax.remat.planner.budget import parse_budget
    from mlsys_jax.remat.planner.report import plan_report

    progress = progress or SILENT
    if not isinstance(repeats, int) or repeats < 1:
        raise MlsysError(f"--repeats must be a positive int, got {repeats!r}")
    wanted = parse_budget(budget)                      # a bad budget fails before any work
    progress.stage(f"loading {target} (the factory builds the model)")
    loss, note = load_factory(target)
    if note:
        print(f"mlsys-jax remat: note: {note}", file=sys.stderr)
    return plan_report(*loss, wanted, repeats=repeats, policies=policies, progress=progress)


def _names(shapes: dict, names, limit=10, labels=None) -> str:
    """The first ``limit`` values, each as ``labels`` names it (module/primitive,
    ``remat.planner.value_names``; else the planner's own name) with its shape."""
    from mlsys_jax.remat.planner.value_names import label_of

    labels = labels or {}
    shown = [f"{label_of(labels, n)} {shapes.get(n, '')}".strip() for n in names[:limit]]
    more = f", … ({len(names) - limit} more; --json lists all)" if len(names) > limit else ""
    return (", ".join(shown) + more) or "(none)"


def _ratio_text(out, p) -> str:
    reference, r = out.ratio(p)
    if reference:
        return "1 (the reference)"
    return "not timed" if r is None else f"{r.median:.4g} [{r.low:.4g}–{r.high:.4g}]"


def describe(p) -> str:
    """The chosen plan in one line: no remat, scan bodies checkpointed, or the MILP's plan."""
    if not p.recomputed:
        return "no remat: the budget fits the user's own gradient"
    if p.scan_policy:
        return (f"{len(p.recomputed)} scan(s) with every trip's body checkpointed, "
                f"{p.method} (the backward recomputes one trip at a time)")
    return (f"{len(p.segments)} segment(s), {len(p.saved)} saved, {len(p.recomputed)} recomputed "
            f"({p.recompute_flops} FLOPs predicted); {p.method}, optimality gap "
            f"{p.optimality_gap:.2%}; pinned (kept from XLA's CSE): "
            f"{'the whole segment backward' if p.pin == 'backward' else 'the recomputation'}")


def print_text(target: str, out) -> None:
    from mlsys_jax.remat.planner.budget import percent
    from mlsys_jax.tables import format_table, wrap

    p, base, budget_bytes = out.plan, out.no_remat, out.budget_bytes
    t0 = base.compiled_temp_bytes
    print(wrap(f"remat {target}: budget {budget_bytes} bytes of XLA temp "
               f"({out.budget.describe(t0)}; no remat compiles to {t0})", first="", rest="  "))
    print(wrap(f"plan: {describe(p)}", first="", rest="  "))
    n = len(out.compiled)
    print(wrap(f"{n} program(s) compiled for the plan (no remat and {n - 1} plan(s)) in "
               f"{out.compile_seconds:.1f} s; of those that fit, the fastest measured"))
    if out.choice:
        print(wrap(f"chosen: {out.choice}"))
    if out.timing_note:
        print(wrap(f"timed: {out.timing_note}"))
    if p.recomputed and not p.scan_policy:
        labels = getattr(out, "labels", None)
        print(wrap(f"saved: {_names(out.shapes, p.saved, labels=labels)}", first="  ",
                   rest="    "))
        print(wrap(f"recomputed: {_names(out.shapes, p.recomputed, labels=labels)}",
                   first="  ", rest="    "))
    rel = out.grads_max_rel_diff
    rows = [{"figure": "predicted peak bytes (backward's residuals)",
             "plan": ("not modelled (scan bodies)" if p.predicted_peak_bytes is None
                      else p.predicted_peak_bytes), "no remat": base.predicted_peak_bytes},
            {"figure": "compiled temp bytes", "plan": p.compiled_temp_bytes, "no remat": t0},
            {"figure": "  of no remat's", "plan": percent(p.compiled_temp_bytes, t0, 100 *
                                                         budget_bytes / t0),
             "no remat": "100%"},
            {"figure": "compiled FLOPs (shown, not judged)", "plan": int(p.compiled_flops),
             "no remat": int(base.compiled_flops)},
            {"figure": "step time ratio (to no remat; paired rounds, median [min–max])",
             "plan": _ratio_text(out, p), "no remat": 1.0},
            {"figure": "grads max |Δ| vs jax.grad (relative to max |g|)",
             "plan": f"{out.grads_max_abs_diff:.3g} ({rel:.3g})", "no remat": 0.0}]
    print(format_table(rows, title="\n[the plan, compiled and timed]"))
    if out.zero_grad_leaves:
        print(f"  {out.zero_grad_leaves} of {out.n_grad_leaves} gradient leaves are exactly zero "
              "in jax.grad itself: the check compares the rest")
    compiled = [{"program": c.label, "compiled temp bytes": c.plan.compiled_temp_bytes,
                 "of no remat's": percent(c.plan.compiled_temp_bytes, t0),
                 "fits": c.plan.compiled_temp_bytes <= budget_bytes,
                 "pin": (f"scan body, {c.plan.scan_policy}" if c.plan.scan_policy else
                         c.plan.pin if c.plan.recomputed else ""),
                 "compiled FLOPs": int(c.plan.compiled_flops),
                 "step time ratio": _ratio_text(out, c.plan)}
                for c in sorted(out.compiled, key=lambda c: c.plan.compiled_temp_bytes)]
    print(format_table(compiled, title="\n[every program compiled for the plan]"))
    matched = out.versus["matched"]
    if matched:
        rows = [{"policy": m["policy"], "policy temp bytes": m["policy_temp_bytes"],
                 "policy FLOPs": int(m["policy_flops"]),
                 "policy step ratio": ("not timed" if m["policy_step_time_ratio"] is None
                                       else m["policy_step_time_ratio"]),
                 "plan temp bytes": m["plan_temp_bytes"],
                 "plan step ratio": m["plan_step_time_ratio"],
                 "not dominated": m["not_dominated"], "why": m["why"]} for m in matched]
        print("\n" + wrap("[JAX's built-in policies, jax.checkpoint(loss_fn, policy=...); those "
                          "that save temp bytes within the budget timed in the same rounds, "
                          "beside the fastest timed plan within each policy's compiled temp "
                          "bytes]", first="", rest=" "))
        print(format_table(rows))


def write_plot(path: str, out) -> str:
    from mlsys_jax.viz import memory

    p = out.plan
    lines = {"budget": out.budget_bytes,
             "no remat, compiled temp bytes": out.no_remat.compiled_temp_bytes}
    if p.recomputed and not p.scan_policy:
        lines["the plan, compiled temp bytes"] = p.compiled_temp_bytes
    written = memory.timeline(path, out.timelines, lines, title=f"Recomputation: {p.n_values} "
                              f"values, {len(p.segments)} segment(s)")
    return f"plot written: {written}" if written else memory.unavailable_reason()


def main(args) -> int:
    import jax

    from mlsys_jax.progress import Progress

    from mlsys_jax import runtime

    if args.plot:
        runtime.check_output_file(args.plot, "--plot")
    if args.trace:
        runtime.check_output_file(args.trace, "--trace")
    progress = Progress("mlsys-jax remat", enabled=not args.quiet)
    try:
        with jax.enable_x64(False):               # the user's model runs under JAX's defaults
            out = report(args.target, args.budget, repeats=args.repeats,
                         policies=not args.no_policies, progress=progress)
            on_shapes = out.abstract
            if on_shapes and args.plot:
                from mlsys_jax.cli.shapes import refuse_values

                refuse_values("--plot", "it draws the memory timeline the plans' runs measured")
            if on_shapes and args.trace:
                from mlsys_jax.cli.shapes import refuse_values

                refuse_values("--trace", "it writes the memory timelines of the plans' runs")
            note = write_plot(args.plot, out) if args.plot else None
            if args.trace:
                from mlsys_jax.cli.exports import remat_trace

                traced = remat_trace(args.trace, args.target, out)
                note = f"{note}\n{traced}" if note else traced
    finally:
        progress.done()
    if args.json:
        print(json.dumps(out.to_dict(), indent=1))
    elif on_shapes:
        print_shapes(args.target, out)
    else:
        print_text(args.target, out)
        if note:
            print(note)
    return 0


def print_shapes(target: str, out) -> None:
    """The plan on shapes: compiled temp bytes decide the fit, the cost model the choice."""
    from mlsys_jax.cli.shapes import notice
    from mlsys_jax.remat.milp import plan_key
    from mlsys_jax.remat.planner.budget import percent
    from mlsys_jax.remat.planner.shapes import PREDICTION
    from mlsys_jax.tables import format_table, wrap

    p, t0 = out.plan, out.no_remat.compiled_temp_bytes
    print(notice())
    print(wrap(f"remat {target}: budget {out.budget_bytes} bytes of XLA temp "
               f"({out.budget.describe(t0)}; no remat compiles to {t0})", first=""))
    print(wrap(f"plan: {describe(p)}", first=""))
    rows = [{"program": out.labels[plan_key(q)], "compiled temp bytes": q.compiled_temp_bytes,
             "of no remat's": percent(q.compiled_temp_bytes, t0),
             "fits": q.compiled_temp_bytes <= out.budget_bytes,
             "compiled FLOPs": int(q.compiled_flops),
             "predicted step time ratio": out.predicted.get(out.labels[plan_key(q)], "-")}
            for q in sorted(out.compiled, key=lambda q: q.compiled_temp_bytes)]
    print(format_table(rows, title="\n[every program compiled for the plan; of those that fit, the "
                                   f"least predicted step time ({PREDICTION}) wins]"))
    if out.policies:
        print(format_table([{"policy": r["policy"], "compiled temp bytes": r["compiled_temp_bytes"],
                             "compiled FLOPs": int(r["compiled_flops"])} for r in out.policies],
                           title="\n[JAX's built-in policies, compiled (not timed)]"))
    print(wrap("step times are predicted, not measured, and no gradient is checked against "
               "jax.grad: on shapes nothing runs", first=""))
