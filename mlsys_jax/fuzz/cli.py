"""``mlsys-jax fuzz``: a differential-testing campaign, or the mutation score (``--mutants``)."""
from __future__ import annotations

import json

from mlsys_jax.errors import MlsysError
from mlsys_jax.report import format_table

DEFAULT_OUT = "fuzz-reproducers"


def _check_args(args) -> None:
    if args.programs is None or args.programs < 1:
        raise MlsysError(f"fuzz: --programs must be a positive integer, got {args.programs}")
    if args.time_budget is not None and args.time_budget <= 0:
        raise MlsysError(f"fuzz: --time-budget must be positive seconds, got {args.time_budget}")
    if args.seed is None or args.seed < 0:
        raise MlsysError(f"fuzz: --seed must be a non-negative integer, got {args.seed}")


def main(args) -> int:
    """Run the campaign; print a table or one JSON object; exit 1 if anything failed."""
    from mlsys_jax.fuzz.campaign import run_campaign
    from mlsys_jax.fuzz.mutants import mutation_score
    from mlsys_jax.passes import registry

    _check_args(args)
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
    s = run_campaign(args.programs, args.seed, passes, time_budget=args.time_budget,
                     out_dir=args.out or DEFAULT_OUT)
    d = s.as_dict()
    if args.json:
        print(json.dumps(d, indent=1))
    else:
        print(_table(d))
    return 0 if not s.failures else 1


def _table(d: dict) -> str:
    rows = [{"pass": n, "fired on": v["fired"],
             "% of valid": round(100 * v["fired"] / max(d["valid"], 1), 1),
             "rewrites": v["rewrites"]} for n, v in d["per_pass"].items()]
    lines = [f"fuzz campaign: seed {d['seed']}, {d['programs']} programs "
             f"({d['valid']} valid, {d['rejected']} rejected) in {d['seconds']:.1f} s"
             + (" — stopped by the time budget" if d["stopped_by_time_budget"] else ""),
             format_table(rows)]
    for reason, n in d["rejected_reasons"].items():
        lines.append(f"  rejected: {n} × {reason}")
    for name, row in d["systems"].items():
        lines.append(f"  {name}: {row.get('cases', 0)} cases, {row.get('failures', 0)} failures"
                     + (f" ({row['skipped']})" if row.get("skipped") else ""))
    lines.append(f"verifier failures {d['verifier_failures']} · mismatches {d['mismatches']} · "
                 f"crashes {d['crashes']} · worst error ratio {d['worst_error_ratio']:.3g}")
    for f in d["failures"][:20]:
        lines.append(f"  FAIL program {f['program']} {f['pass']} ({f['kind']}): "
                     f"{f['message'][:120]}")
    for path in d["reproducers"]:
        lines.append(f"  reproducer: {path}  (move it to tests/regressions/ to keep it)")
    return "\n".join(lines)
