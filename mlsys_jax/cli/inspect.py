"""``mlsys-jax inspect FILE.py:FN [--arg SPEC ...]``: a user's function as a costed graph."""
from __future__ import annotations

import json
from pathlib import Path

from mlsys_jax import runtime
from mlsys_jax.cli import target
from mlsys_jax.errors import MlsysError

HELP = "cost table of a function's jaxpr"


def add_arguments(p) -> None:
    target.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--grad", action="store_true",
                   help="inspect the gradient of the summed first output w.r.t. the first "
                        "argument (a factory's parameters)")
    table = p.add_mutually_exclusive_group()
    table.add_argument("--fused", action="store_true", default=None,
                       help="table of the fused kernels (the default on cpu)")
    table.add_argument("--unfused", action="store_false", dest="fused",
                       help="table of one kernel per op (the default on the GPU models)")
    p.add_argument("--dot", metavar="OUT.dot", help="write a Graphviz DOT file")
    add_measure_arguments(p)


def add_measure_arguments(p) -> None:
    from mlsys_jax.cli.measured import add_budget_argument

    p.add_argument("--measure", action="store_true",
                   help="compile the function with jax.jit and time it here, beside the estimate")
    p.add_argument("--rounds", type=int, default=11,
                   help="interleaved timing rounds for --measure (default 11)")
    add_budget_argument(p)


def report_json(report, both) -> dict:
    """The ``--json`` object: every kernel of the table, the totals (unfused, with the fused
    estimate beside them), unknown primitives, primitive counts."""
    from mlsys_jax.cli.measured import kernel_fields

    return {"ops": [{"name": k.name, "primitives": list(k.primitives), "flops": k.flops,
                     "bytes": k.bytes, "time_us": k.time_us, **kernel_fields(report, k)}
                    for k in report.kernels],
            "fused": report.fused,
            "total": {**both.totals(), "peak_bytes": report.peak_bytes},
            "unknown": list(report.unknown), "primitives": dict(report.primitives)}


def main(args) -> int:
    from mlsys_jax.cli.headline import compiler_note, estimates
    from mlsys_jax.cost.fusion import LABELS
    from mlsys_jax.ir import to_dot
    from mlsys_jax.tables import format_table, wrap

    if args.dot:  # checked before the work, not after it
        runtime.check_output_file(args.dot, "--dot")
    check_measure_options(args)
    user = target.resolve(args)
    closed = user.trace(grad=args.grad)
    both = estimates(closed, args.hw, args.dtype)
    report = both.default if args.fused is None else both.fused if args.fused else both.unfused
    if args.dot:
        Path(args.dot).write_text(to_dot(closed, name=user.name))
    measured = measure_whole(closed, user, args, report)
    if args.json:
        print(json.dumps({**report_json(report, both),
                          **({"measured": measured[0]} if measured else {})}, indent=1))
        return 0
    print(closed)
    from mlsys_jax.cli.measured import table_columns

    columns = ("name", "in", "out", "flops", "bytes", "intensity", "bound", "time_us",
               *table_columns(report))
    rows = [{k: r[k] for k in columns} for r in report.rows()]
    hw = report.hardware
    model = LABELS[hw.fusion] if report.fused else LABELS["none"]
    dtypes = args.dtype or "native dtypes: " + ", ".join(_input_dtypes(closed))
    print(format_table(rows, title=f"\n[kernels: {model}; {hw.name}, {dtypes}]"))
    t = report.totals()
    print(f"\ntotal: {t['flops'] / 1e9:.4g} GFLOP, {t['bytes'] / 1e6:.4g} MB moved, "
          f"peak live {t['peak_bytes'] / 1e6:.4g} MB")
    print(wrap(f"estimate: {both.line()}", first=""))
    print(wrap(compiler_note(hw), first=""))
    print_measured(report, measured)
    if report.unknown:
        print(wrap("unknown primitives (no cost rule, counted as 0 FLOPs): "
                   f"{', '.join(report.unknown)}", first=""))
    if args.dot:
        print(f"DOT written to {args.dot}")
    return 0


def check_measure_options(args) -> None:
    from mlsys_jax.cli.measured import check_here_options

    if args.rounds < 1:
        raise MlsysError(f"--rounds must be a positive integer, got {args.rounds}")
    check_here_options(args)


def measure_whole(closed, user, args, report):
    """With ``--measure``: the function timed under ``jax.jit`` on its example (or seeded random)
    inputs, as ``(the --json dict, the Timing)``; else None."""
    from mlsys_jax.cli.measured import measured_dict, time_whole

    if not args.measure:
        return None
    t = time_whole(closed, user.inputs(), args.rounds)
    return measured_dict(report.time_us, t), t


def print_measured(report, measured) -> None:
    from mlsys_jax.cli.measured import efficiency_line, prediction_line
    from mlsys_jax.tables import wrap

    line = efficiency_line(report)
    if line:
        print(wrap(line, first=""))
    if measured:
        hw = report.hardware.name
        note = "" if hw in ("cpu", "here") else " (this machine's CPU: compare with --hw here)"
        print(wrap(prediction_line("whole function", f"{hw}, the table's estimate",
                                   report.time_us, measured[1]) + note, first=""))


def _input_dtypes(closed) -> list[str]:
    """The dtypes of the graph's inputs and constants (``f32``, ``key<fry>``), for the title."""
    from mlsys_jax.cost.model import dtype_name

    avals = [v.aval for v in closed.jaxpr.invars + closed.jaxpr.constvars]
    return list(dict.fromkeys(dtype_name(a.dtype) for a in avals if hasattr(a, "dtype")))
