"""``mlsys-jax inspect FILE.py:FN --arg SPEC ...``: a user's function as a costed graph."""
from __future__ import annotations

import json
from pathlib import Path

from mlsys_jax import runtime
from mlsys_jax.cli import target

HELP = "cost table of a function's jaxpr"


def add_arguments(p) -> None:
    target.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--grad", action="store_true",
                   help="inspect the gradient of the summed first output w.r.t. the first argument")
    p.add_argument("--fused", action="store_true", help="group kernels with the fusion model")
    p.add_argument("--dot", metavar="OUT.dot", help="write a Graphviz DOT file")


def report_json(report) -> dict:
    """The ``--json`` object: every kernel, the totals, unknown primitives, primitive counts."""
    return {"ops": [{"name": k.name, "primitives": list(k.primitives), "flops": k.flops,
                     "bytes": k.bytes, "time_us": k.time_us} for k in report.kernels],
            "total": report.totals(), "unknown": list(report.unknown),
            "primitives": dict(report.primitives)}


def main(args) -> int:
    from mlsys_jax.cost import estimate
    from mlsys_jax.ir import to_dot
    from mlsys_jax.tables import format_table, wrap

    if args.dot:  # checked before the work, not after it
        runtime.check_output_file(args.dot, "--dot")
    user = target.resolve(args)
    closed = user.trace(grad=args.grad)
    report = estimate(closed, hw=args.hw, dtype=args.dtype, fused=args.fused)
    if args.dot:
        Path(args.dot).write_text(to_dot(closed, name=user.name))
    if args.json:
        print(json.dumps(report_json(report), indent=1))
        return 0
    print(closed)
    rows = [{k: r[k] for k in ("name", "in", "out", "flops", "bytes", "intensity", "bound", "time_us")}
            for r in report.rows()]
    hw = report.hardware
    print(format_table(rows, title=f"\n[kernels: {'fused' if args.fused else 'one per op'}; "
                                   f"{hw.name}, {args.dtype or 'native dtypes'}]"))
    t = report.totals()
    print(f"\ntotal: {t['kernels']} kernels, {t['flops'] / 1e9:.4g} GFLOP, {t['bytes'] / 1e6:.4g} MB, "
          f"{t['time_us']:.4g} µs; peak live {t['peak_bytes'] / 1e6:.4g} MB")
    if report.unknown:
        print(wrap("unknown primitives (no cost rule, counted as 0 FLOPs): "
                   f"{', '.join(report.unknown)}", first=""))
    if args.dot:
        print(f"DOT written to {args.dot}")
    return 0
