"""``mlsys-jax remat FILE.py:FN --budget BYTES|PCT%|min [--json] [--plot OUT.png] [--quiet]``.

FN is an example factory returning ``(loss_fn, params, batch)`` — or the ``shard`` command's
``(loss_fn, params, batch, optimizer[, rules])``, whose optimizer and rules are ignored (said on
stderr) — and the gradient is taken with respect to ``params`` only. The plan is chosen on the
compiled program (``remat.Frontier``): the budget is XLA's temp bytes (``PCT%`` of no remat's,
``700MB``, ``min`` for the least any plan reaches); of the plans that fit, the fastest measured.
Printed: the plan (saved and recomputed values), its predicted peak, the compiled temp bytes and
FLOPs, the step time ratio to no remat (measured side by side), the gradients' max |Δ| against
``jax.grad``, and JAX's built-in policies timed in the same rounds beside the fastest plan within
each policy's temp bytes (``--no-policies`` skips them). Progress goes to stderr (``--quiet``
silences it). The user's model runs under JAX's defaults (float32), as in their own code.
"""
from __future__ import annotations

import json
import sys

from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch[, optimizer[, rules]])"
JSON_KEYS = ("budget_bytes", "predicted_peak_bytes", "compiled_temp_bytes", "compiled_flops",
             "step_time_ratio", "grads_max_abs_diff", "saved", "recomputed", "policies")

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
    p.add_argument("--repeats", type=int, default=7,
                   help="timing rounds at most (default 7; fewer when steps are long)")
    p.add_argument("--no-policies", action="store_true",
                   help="skip compiling and timing JAX's built-in policies")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def load_factory(target: str):
    """The shared loader (``cli.target.load_factory``): ``(loss_fn, params, batch)`` with arrays
    among the parameters, and a note when the factory also returned an optimizer (or rules)."""
    import jax

    from mlsys_jax.cli.target import load_factory as load

    loss_fn, params, batch, optimizer, rules = load(target, FORM)
    if not jax.tree_util.tree_leaves(params):
        raise MlsysError(f"{target}: params (the second value) has no arrays; return the "
                         "model's parameters, e.g. model.init(key, x)")
    extra = [name for name, v in (("optimizer", optimizer), ("partition rules", rules))
             if v is not None]
    one = len(extra) == 1
    note = (f"the factory's {' and '.join(extra)} {'is' if one else 'are'} ignored: remat plans "
            f"the gradient of loss_fn, which {'it does' if one else 'they do'} not change"
            ) if extra else None
    return (loss_fn, params, batch), note


def report(target: str, budget, repeats: int = 7, policies: bool = True,
           progress=None) -> dict:
    """Plan at ``budget`` and measure it beside no remat (and JAX's built-in policies)."""
    from mlsys_jax.progress import SILENT
    from mlsys_jax.remat.planner.budget import parse_budget
    from mlsys_jax.remat.planner.frontier import Frontier
    from mlsys_jax.remat.planner.policies import compare_policies, policy_programs

    progress = progress or SILENT
    if not isinstance(repeats, int) or repeats < 1:
        raise MlsysError(f"--repeats must be a positive int, got {repeats!r}")
    wanted = parse_budget(budget)                      # a bad budget fails before any work
    progress.stage(f"loading {target} (the factory builds the model)")
    loss, note = load_factory(target)
    if note:
        print(f"mlsys-jax remat: note: {note}", file=sys.stderr)
    fr = Frontier(*loss, repeats=repeats, progress=progress)
    nbytes = wanted.bytes_of(fr.no_remat.compiled_temp_bytes)
    if nbytes is None:
        fr.compile_least()
        candidates = [fr.choose(None)]
    else:
        candidates = fr.search(nbytes)[:fr.n_timed()]
        if not candidates:
            raise fr.refusal(nbytes)
    built = policy_programs(fr) if policies else {}
    times = fr.time(candidates, extra=built.values())
    chosen = fr.choose(nbytes)
    versus = compare_policies(fr, built, times, candidates)
    prog = fr.program(chosen)
    return {"budget_bytes": chosen.budget_bytes,
            "predicted_peak_bytes": chosen.predicted_peak_bytes,
            "compiled_temp_bytes": chosen.compiled_temp_bytes,
            "compiled_flops": chosen.compiled_flops,
            "step_time_ratio": fr.step_time_ratio(chosen),
            "grads_max_abs_diff": prog.grads_max_abs_diff,
            "saved": list(chosen.saved), "recomputed": list(chosen.recomputed),
            "policies": versus["policies"],
            "_extra": {"plan": chosen, "frontier": fr, "versus": versus, "budget": wanted,
                       "program": prog, "note": note}}


def _names(graph, names, limit=10) -> str:
    shape = dict(zip(graph.names, graph.shapes))
    shown = [f"{n} {shape.get(n, '')}".strip() for n in names[:limit]]
    more = f", … ({len(names) - limit} more; --json lists all)" if len(names) > limit else ""
    return (", ".join(shown) + more) or "(none)"


def _ratio_text(fr, p) -> str:
    from mlsys_jax.remat.milp import plan_key

    r = fr.timings.get(plan_key(p))
    if plan_key(p) == plan_key(fr.no_remat):
        return "1 (the reference)"
    return "not timed" if r is None else f"{r.median:.4g} [{r.low:.4g}–{r.high:.4g}]"


def print_text(target: str, out: dict) -> None:
    from mlsys_jax.remat.planner.budget import percent
    from mlsys_jax.tables import format_table

    extra = out["_extra"]
    p, fr, prog = extra["plan"], extra["frontier"], extra["program"]
    base = fr.no_remat
    t0 = base.compiled_temp_bytes
    print(f"remat {target}: budget {out['budget_bytes']} bytes of XLA temp "
          f"({extra['budget'].describe(t0)}; no remat compiles to {t0})")
    kind = "no remat: the budget fits the user's own gradient" if not p.recomputed else (
        f"{len(p.segments)} segment(s), {len(p.saved)} saved, {len(p.recomputed)} recomputed "
        f"({p.recompute_flops} FLOPs predicted); {p.method}, optimality gap "
        f"{p.optimality_gap:.2%}; pinned (kept from XLA's CSE): "
        f"{'the whole segment backward' if p.pin == 'backward' else 'the recomputation'}")
    print(f"plan: {kind}")
    seconds = sum(fr.program(q).compile_s for q in fr.measured)
    print(f"  {len(fr.measured)} program(s) compiled for the plan (no remat and "
          f"{len(fr.measured) - 1} plan(s)) in {seconds:.1f} s; of those that fit, the fastest "
          "measured")
    if p.recomputed:
        print(f"  saved:      {_names(fr.graph, p.saved)}")
        print(f"  recomputed: {_names(fr.graph, p.recomputed)}")
    rel = prog.grads_max_rel_diff
    zero = fr.programs.zero_grad_leaves
    rows = [{"figure": "predicted peak bytes (backward's residuals)",
             "plan": p.predicted_peak_bytes, "no remat": base.predicted_peak_bytes},
            {"figure": "compiled temp bytes", "plan": p.compiled_temp_bytes, "no remat": t0},
            {"figure": "  of no remat's", "plan": percent(p.compiled_temp_bytes, t0, 100 *
                                                         out["budget_bytes"] / t0),
             "no remat": "100%"},
            {"figure": "compiled FLOPs (shown, not judged)", "plan": int(p.compiled_flops),
             "no remat": int(base.compiled_flops)},
            {"figure": "step time ratio (to no remat; paired rounds, median [min–max])",
             "plan": _ratio_text(fr, p), "no remat": 1.0},
            {"figure": "grads max |Δ| vs jax.grad (relative to max |g|)",
             "plan": f"{prog.grads_max_abs_diff:.3g} ({rel:.3g})", "no remat": 0.0}]
    print(format_table(rows, title="\n[the plan, compiled and timed]"))
    if zero:
        print(f"  {zero} of {len(fr.flat.diff)} gradient leaves are exactly zero in jax.grad "
              "itself: the check compares the rest")
    compiled = [{"program": fr.labels[k], "compiled temp bytes": q.compiled_temp_bytes,
                 "of no remat's": percent(q.compiled_temp_bytes, t0),
                 "fits": q.compiled_temp_bytes <= out["budget_bytes"],
                 "pin": q.pin if q.recomputed else "", "compiled FLOPs": int(q.compiled_flops),
                 "step time ratio": _ratio_text(fr, q)}
                for q in sorted(fr.measured, key=lambda q: q.compiled_temp_bytes)
                for k in [_key(q)]]
    print(format_table(compiled, title="\n[every program compiled for the plan]"))
    matched = extra["versus"]["matched"]
    if matched:
        rows = [{"policy": m["policy"], "policy temp bytes": m["policy_temp_bytes"],
                 "policy FLOPs": int(m["policy_flops"]),
                 "policy step ratio": m["policy_step_time_ratio"],
                 "plan temp bytes": m["plan_temp_bytes"],
                 "plan step ratio": m["plan_step_time_ratio"],
                 "not dominated": m["not_dominated"], "why": m["why"]} for m in matched]
        print(format_table(rows, title="\n[JAX's built-in policies, jax.checkpoint(loss_fn, "
                                       "policy=...), timed in the same rounds, beside the fastest "
                                       "timed plan within each policy's compiled temp bytes]"))


def _key(p):
    from mlsys_jax.remat.milp import plan_key

    return plan_key(p)


def write_plot(path: str, out: dict) -> str:
    from mlsys_jax.viz import memory

    extra = out["_extra"]
    fr, p = extra["frontier"], extra["plan"]
    series = {"no remat": fr.problem.timeline(fr.no_remat)}
    if p.recomputed:
        series["the plan"] = fr.problem.timeline(p)
    lines = {"budget": out["budget_bytes"],
             "no remat, compiled temp bytes": fr.no_remat.compiled_temp_bytes}
    if p.recomputed:
        lines["the plan, compiled temp bytes"] = p.compiled_temp_bytes
    written = memory.timeline(path, series, lines, title=f"Recomputation: {p.n_values} values, "
                              f"{len(p.segments)} segment(s)")
    return f"plot written: {written}" if written else memory.unavailable_reason()


def main(args) -> int:
    import jax

    from mlsys_jax.progress import Progress

    from mlsys_jax import runtime

    if args.plot:
        runtime.check_output_file(args.plot, "--plot")
    progress = Progress("mlsys-jax remat", enabled=not args.quiet)
    try:
        with jax.enable_x64(False):               # the user's model runs under JAX's defaults
            out = report(args.target, args.budget, args.repeats, not args.no_policies, progress)
            note = write_plot(args.plot, out) if args.plot else None
    finally:
        progress.done()
    if args.json:
        print(json.dumps({k: out[k] for k in JSON_KEYS}, indent=1))
    else:
        print_text(args.target, out)
        if note:
            print(note)
    return 0
