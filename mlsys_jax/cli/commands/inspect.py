"""``mlsys-jax inspect FILE.py:FN [--arg SPEC ...]``: a user's function as a costed graph.

By default a table per module of the user's model (parameters, FLOPs, bytes, both estimates,
share, bound; :mod:`mlsys_jax.cli.summary`), the totals and the headline estimate; ``--ops`` the
table per kernel, ``--jaxpr`` the jaxpr (printed anyway when it is short), ``--plot`` the
roofline chart of the table's rows, ``--json`` all of it.
"""
from __future__ import annotations

import json
from pathlib import Path

from mlsys_jax import runtime
from mlsys_jax.cli import target
from mlsys_jax.errors import MlsysError

HELP = "cost table of a function's jaxpr, per module of the model"
JAXPR_SHOWN = 300  # equations: a jaxpr this short is printed without --jaxpr


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
    p.add_argument("--depth", type=int, default=None, metavar="N",
                   help="levels of modules in the table (default: the most that fit ~40 rows)")
    p.add_argument("--ops", action="store_true", help="one row per kernel instead of per module")
    p.add_argument("--jaxpr", action="store_true",
                   help=f"print the jaxpr (printed anyway up to {JAXPR_SHOWN} equations)")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write the roofline chart of the table's rows (needs the plot extra)")
    p.add_argument("--dot", metavar="OUT.dot", help="write a Graphviz DOT file")
    p.add_argument("--xla", action="store_true",
                   help="compile the function and print XLA's own FLOPs and bytes beside ours "
                        "(always on shapes)")
    add_measure_arguments(p)


def add_measure_arguments(p) -> None:
    from mlsys_jax.cli.measured import add_budget_argument

    p.add_argument("--measure", action="store_true",
                   help="compile the function with jax.jit and time it here, beside the estimate")
    p.add_argument("--rounds", type=int, default=11,
                   help="interleaved timing rounds for --measure (default 11)")
    add_budget_argument(p)


def report_json(report, both, summary=None) -> dict:
    """The ``--json`` object: every kernel of the table, the totals (unfused, with the fused
    estimate beside them), unknown primitives, primitive counts; with a ``summary``, the module
    of each kernel and every module of the tree."""
    from mlsys_jax.cli.measured import kernel_fields

    modules = summary.placed["fused" if report.fused else "unfused"] if summary else None
    ops = [{"name": k.name, "primitives": list(k.primitives), "flops": k.flops,
            "bytes": k.bytes, "time_us": k.time_us, **kernel_fields(report, k)}
           for k in report.kernels]
    out = {"ops": ops, "fused": report.fused,
           "total": {**both.totals(), "peak_bytes": report.peak_bytes},
           "unknown": list(report.unknown), "primitives": dict(report.primitives)}
    if summary:
        from mlsys_jax.cli.summary import json_rows

        for op, path in zip(ops, modules):
            op["module"] = "/".join(path)
        out.update(modules=json_rows(summary), module_depth=summary.depth,
                   module_levels=summary.levels, model="/".join(summary.root),
                   params=summary.node.params, param_bytes=summary.node.param_bytes)
    return out


def main(args) -> int:
    from mlsys_jax.cli.headline import estimates
    from mlsys_jax.cli.summary import summarize, weights_of
    from mlsys_jax.ir import to_dot

    for path, flag in ((args.dot, "--dot"), (args.plot, "--plot")):
        if path:  # checked before the work, not after it
            runtime.check_output_file(path, flag)
    if args.plot:
        _require_plots()
    check_measure_options(args)
    user = target.resolve(args)
    on_shapes = _on_shapes(user, args)
    closed = user.trace(grad=args.grad)
    both = estimates(closed, args.hw, args.dtype)
    report = both.default if args.fused is None else both.fused if args.fused else both.unfused
    summary = summarize(both, weights_of(user, closed), args.depth)
    if args.dot:
        Path(args.dot).write_text(to_dot(closed, name=user.name))
    if args.plot:
        _plot(args.plot, summary, report, args.ops, user.name)
    measured = measure_whole(closed, user, args, report)
    xla = _xla(closed) if on_shapes or args.xla else None
    if args.json:
        out = report_json(report, both, summary)
        out["abstract"] = on_shapes
        if xla:
            out["total"].update(xla.as_dict())
        print(json.dumps({**out, **({"measured": measured[0]} if measured else {})}, indent=1))
        return 0
    equations = _count_equations(closed)
    if args.jaxpr or equations <= JAXPR_SHOWN:
        print(closed)
    _print_tables(args, closed, both, report, summary, equations, measured, xla)
    for path, what in ((args.dot, "DOT"), (args.plot, "roofline plot")):
        if path:
            print(f"{what} written to {path}")
    return 0


def _print_tables(args, closed, both, report, summary, equations: int, measured, xla) -> None:
    from mlsys_jax.cli.headline import compiler_note
    from mlsys_jax.cli.measured import table_columns
    from mlsys_jax.cli.summary import text_rows
    from mlsys_jax.cost.fusion import LABELS
    from mlsys_jax.tables import format_table, wrap

    hw = report.hardware
    dtypes = args.dtype or "native dtypes: " + ", ".join(_input_dtypes(closed))
    if args.ops:
        columns = ("name", "in", "out", "flops", "bytes", "intensity", "bound", "time_us",
                   *table_columns(report))
        rows = [{k: r[k] for k in columns} for r in report.rows()]
        model = LABELS[hw.fusion] if report.fused else LABELS["none"]
        print(format_table(rows, title=f"\n[kernels: {model}; {hw.name}, {dtypes}]"))
    else:
        name = f" of {'/'.join(summary.root)}" if summary.root else ""
        print(format_table(text_rows(summary),
                           title=f"\n[modules{name}: share, bytes and bound of the "
                                 f"{both.default_label} estimate; {hw.name}, {dtypes}]"))
        levels = (f"{summary.depth} of {summary.levels} levels (--depth N); "
                  if summary.levels > 1 else "")
        print(wrap(f"{levels}the rows below a module sum to it, and a kernel spanning modules "
                   "counts in the innermost one holding them all. --ops: one row per kernel"
                   + ("" if args.jaxpr or equations <= JAXPR_SHOWN else
                      f"; --jaxpr: the jaxpr ({equations:,} equations)"), first="  "))
    t = report.totals()
    params = (f"; {summary.node.params:,} parameters, {summary.node.param_bytes / 1e6:.4g} MB"
              if summary.node.params else "")
    print(f"\ntotal: {t['flops'] / 1e9:.4g} GFLOP, {t['bytes'] / 1e6:.4g} MB moved, "
          f"peak live {t['peak_bytes'] / 1e6:.4g} MB{params}")
    if xla:
        from mlsys_jax.cli.shapes import why_line, xla_line

        print(wrap(xla_line(xla), first=""))
        why = why_line(both.unfused.total_flops, xla, summary, closed)
        if why:
            print(wrap(why, first=""))
    print(wrap(f"estimate: {both.line()}", first=""))
    print(wrap(compiler_note(hw), first=""))
    print_measured(report, measured)
    if report.unknown:
        print(wrap("unknown primitives (no cost rule, counted as 0 FLOPs): "
                   f"{', '.join(report.unknown)}", first=""))


def _on_shapes(user, args) -> bool:
    """Whether the factory returned shapes only; refuses what needs values, and says so first."""
    from mlsys_jax.cli import shapes
    from mlsys_jax.ir.abstract import is_abstract

    if not (user.examples and is_abstract(user.args)):
        return False
    if args.measure:
        shapes.refuse_values("--measure", "it times the function on its arrays")
    if args.hw == "here":
        shapes.refuse_values("--hw here", "it times every kernel on arrays of its size; use a "
                             "roofline model, --hw h100 or --hw cpu")
    if not args.json:
        print(shapes.NOTICE)
    return True


def _xla(closed):
    """XLA's figures of the function, compiled on its avals (nothing allocated)."""
    from mlsys_jax.cost.xla import xla_figures

    return xla_figures(closed)


def _count_equations(closed) -> int:
    from mlsys_jax.ir import primitive_counts

    return sum(primitive_counts(closed).values())


def _require_plots() -> None:
    from mlsys_jax.viz.plots import unavailable_reason

    reason = unavailable_reason()
    if reason:
        raise MlsysError(f"--plot: {reason}")


def _plot(path: str, summary, report, per_kernel: bool, name: str) -> None:
    from mlsys_jax.viz.roofline import points_of_kernels, points_of_rows, roofline

    hw = report.hardware
    points = points_of_kernels(report) if per_kernel else points_of_rows(
        summary.leaves(), summary.default_fused)
    what = "kernel" if per_kernel else "module"
    roofline(path, points, hw, title=f"{name} on {hw.name}: one marker per {what}, "
                                     "area ∝ estimated time")


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
    from mlsys_jax.cli.headline import other_machine_note
    from mlsys_jax.cli.measured import efficiency_line, prediction_line
    from mlsys_jax.tables import wrap

    line = efficiency_line(report)
    if line:
        print(wrap(line, first=""))
    if measured:
        hw = report.hardware.name
        print(wrap(prediction_line("whole function", f"{hw}, the table's estimate",
                                   report.time_us, measured[1]) + other_machine_note(hw),
                   first=""))


def _input_dtypes(closed) -> list[str]:
    """The dtypes of the graph's inputs and constants (``f32``, ``key<fry>``), for the title."""
    from mlsys_jax.cost.model import dtype_name

    avals = [v.aval for v in closed.jaxpr.invars + closed.jaxpr.constvars]
    return list(dict.fromkeys(dtype_name(a.dtype) for a in avals if hasattr(a, "dtype")))
