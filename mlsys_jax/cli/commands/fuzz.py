"""``mlsys-jax fuzz``: a differential-testing campaign, or the mutation score (``--mutants``)."""
from __future__ import annotations

import json
import math

from mlsys_jax.errors import MlsysError

HELP = "differential testing of passes on random programs"
DEFAULT_OUT = "fuzz-reproducers"


def add_arguments(p) -> None:
    p.add_argument("--programs", type=int, default=300, metavar="N",
                   help="random programs to run (default 300)")
    p.add_argument("--seed", type=int, default=0, metavar="N",
                   help="seed of the random programs (default 0)")
    p.add_argument("--passes", default=None, metavar="PASS,...",
                   help="comma-separated passes (default: all)")
    p.add_argument("--time-budget", type=float, default=None, dest="time_budget",
                   metavar="SECONDS", help="stop after this many seconds")
    p.add_argument("--mutants", action="store_true", help="run the mutation-score campaign")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", default=None, metavar="DIR",
                   help=f"folder for reproducers of failures (default {DEFAULT_OUT})")


def _check_args(args) -> None:
    if args.programs is None or args.programs < 1:
        raise MlsysError(f"fuzz: --programs must be a positive integer, got {args.programs}")
    budget = args.time_budget
    if budget is not None and (not math.isfinite(budget) or budget <= 0):  # nan <= 0 is False
        raise MlsysError(f"fuzz: --time-budget must be a positive, finite number of seconds, got "
                         f"{budget} (leave it out for no budget)")
    if args.seed is None or args.seed < 0:
        raise MlsysError(f"fuzz: --seed must be a non-negative integer, got {args.seed}")


def main(args) -> int:
    """Run the campaign; print a table or one JSON object; exit 1 if anything failed."""
    from mlsys_jax import runtime
    from mlsys_jax.fuzz.campaign import CampaignOptions, run_campaign
    from mlsys_jax.fuzz.mutants import mutation_score
    from mlsys_jax.passes import registry
    from mlsys_jax.progress import Progress
    from mlsys_jax.tables import format_table

    _check_args(args)
    runtime.enable_x64()  # the oracles judge float32 rewrites against the float64 program
    if args.mutants:
        res = mutation_score(args.seed, limit=args.programs)
        if args.json:
            print(json.dumps(res, indent=1))
        else:
            rows = [{"mutant": r["mutant"], "breaks": r["target"], "caught": r["caught"],
                     "after programs": r["programs"], "how": (r["how"] or "")[:70]}
                    for r in res["mutants"]]
            print(format_table(rows, f"mutation score {res['caught']}/{res['total']} "
                                     f"(seed {res['seed']}, ≤{res['limit']} programs each)"))
        return 0 if res["caught"] == res["total"] else 1
    passes = registry.instantiate(args.passes, "fuzz --passes")
    # failures are shrunk and saved as pytest files (created only when something fails)
    progress = Progress("mlsys-jax fuzz")
    options = CampaignOptions(time_budget=args.time_budget, out_dir=args.out or DEFAULT_OUT)
    s = run_campaign(args.programs, args.seed, passes, options=options, progress=progress)
    progress.done()
    d = s.as_dict()
    if args.json:
        print(json.dumps(d, indent=1))
    else:
        print(_table(d))
    return 0 if not s.failures else 1


def _table(d: dict) -> str:
    from mlsys_jax.tables import format_table, wrap

    rows = [{"pass": n, "fired on": v["fired"],
             "% of valid": round(100 * v["fired"] / max(d["valid"], 1), 1),
             "rewrites": v["rewrites"]} for n, v in d["per_pass"].items()]
    lines = [wrap(f"fuzz campaign: seed {d['seed']}, {d['programs']} programs "
                  f"({d['valid']} valid, {d['rejected']} rejected) in {d['seconds']:.1f} s"
                  + (" — stopped by the time budget" if d["stopped_by_time_budget"] else ""),
                  first=""),
             format_table(rows)]
    for reason, n in d["rejected_reasons"].items():
        lines.append(wrap(f"rejected: {n} × {reason}", first="  "))
    for name, row in d["systems"].items():
        lines.append(f"  {name}: {row.get('cases', 0)} cases, {row.get('failures', 0)} failures"
                     + (f" ({row['skipped']})" if row.get("skipped") else ""))
    lines.append(f"verifier failures {d['verifier_failures']} · mismatches {d['mismatches']} · "
                 f"crashes {d['crashes']} · fixpoints that did not converge "
                 f"{d['fixpoint_failures']} of {d['fixpoint_programs']} programs · rewrites "
                 f"refused by translation validation {len(d['validation_refusals'])} · worst "
                 f"error ratio {d['worst_error_ratio']:.3g}")
    for f in d["failures"][:20]:
        lines.append(wrap(f"FAIL program {f['program']} {f['pass']} ({f['kind']}): "
                          f"{f['message'][:120]}", first="  "))
    for path in d["reproducers"]:
        lines.append(wrap(f"reproducer: {path}  (move it to tests/regressions/ to keep it)",
                          first="  "))
    return "\n".join(lines)
