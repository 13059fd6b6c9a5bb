"""``mlsys-jax inspect FILE.py:FN [--arg SPEC ...]``: a user's function as a costed graph.

By default a table per module of the user's model (parameters, state, FLOPs, bytes, both
estimates, share, bound, input and output shapes; :mod:`mlsys_jax.cli.summary`, fitted to the
terminal), the model's parameters beside its state (:mod:`mlsys_jax.cli.variables`), the totals
beside XLA's own figures of the compiled function (``--no-xla`` skips the compile), the FLOP
convention in one line and the headline estimate; stages over 2 s show progress on stderr
(:class:`mlsys_jax.progress.SlowStages`). ``--ops`` the
table per kernel, ``--jaxpr`` the jaxpr (only when asked), ``--plot`` the
roofline chart of the table's rows, ``--json`` all of it; ``--dot`` the graph, ``--trace`` the
kernels as Chrome trace events, ``--html`` one page of it all (``cli/exports.py``).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlsys_jax import runtime
from mlsys_jax.cli import target
from mlsys_jax.errors import MlsysError

HELP = "cost table of a function's jaxpr, per module of the model"


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
    p.add_argument("--jaxpr", action="store_true", help="print the jaxpr before the tables")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write the roofline chart of the table's rows (needs the plot extra)")
    p.add_argument("--dot", metavar="OUT.dot",
                   help="write a Graphviz DOT file (one cluster per module; past 300 nodes one "
                        "node per module)")
    p.add_argument("--trace", metavar="OUT.json",
                   help="write the kernels as Chrome trace events, one after another with their "
                        "estimated (or measured) times (open in ui.perfetto.dev)")
    p.add_argument("--html", metavar="OUT.html",
                   help="write one self-contained page: module tree, tables, roofline chart")
    p.add_argument("--xla", action=argparse.BooleanOptionalAction, default=True,
                   help="compile the function (on its shapes, nothing allocated) and print XLA's "
                        "own FLOPs, bytes accessed and memory beside ours (default; --no-xla "
                        "skips the compile, except on shapes)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress on stderr (shown for stages that run over 2 s)")
    add_measure_arguments(p)


def add_measure_arguments(p) -> None:
    from mlsys_jax.cli.measured import add_budget_argument

    p.add_argument("--measure", action="store_true",
                   help="compile the function with jax.jit and time it here, beside the estimate")
    p.add_argument("--rounds", type=int, default=11, metavar="N",
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
           "unknown": list(report.unknown), "primitives": dict(report.primitives),
           "uncounted_loops": report.uncounted_loops}
    if summary:
        from mlsys_jax.cli.summary import json_rows

        for op, path in zip(ops, modules):
            op["module"] = "/".join(path)
        node = summary.node
        out.update(modules=json_rows(summary), module_depth=summary.depth,
                   module_levels=summary.levels, model="/".join(summary.root),
                   params=node.params, param_bytes=node.param_bytes, state=node.state,
                   state_bytes=node.state_bytes, inputs=list(node.inputs),
                   outputs=list(node.outputs))
    return out


@dataclass
class InspectRun:
    """What ``inspect`` computed (:func:`compute`): the graph, both estimates and the table's
    report, the module tree, and with ``--measure``/``--xla`` the timing and XLA's figures."""

    closed: Any
    both: Any
    report: Any
    summary: Any
    measured: Any
    xla: Any
    on_shapes: bool
    equations: int
    variables: dict = None  # jaxpr Var -> cli.variables.Variable: the model's arrays
    xla_error: str = ""     # why XLA's figures are missing when the compile failed
    probe_us: float | None = None  # --hw cpu: one call of the compiled function, timed here
    fused_contractions: list = None  # --hw here: contractions of XLA's multi-contraction kernels

    def to_json(self) -> dict:
        """The ``--json`` object."""
        from mlsys_jax.cli.headline import flop_convention

        out = report_json(self.report, self.both, self.summary)
        out["abstract"] = self.on_shapes
        out["flop_convention"] = flop_convention()
        if self.xla:
            out["total"].update(self.xla.as_dict())
        if self.xla_error:
            out["xla_error"] = self.xla_error
        if self.fused_contractions is not None:
            out["xla_fused_contractions"] = self.fused_contractions
        if self.probe_us:
            out["probe"] = {"us": self.probe_us,
                            "predicted_over_probe": self.report.time_us / self.probe_us}
        if self.variables:
            out["variables"] = variables_json(self.variables)
        return {**out, **({"measured": self.measured[0]} if self.measured else {})}


def variables_json(variables: dict) -> list[dict]:
    """Each array of the model: its name (a Keras variable's path, else its pytree path), kind
    (``param`` or ``state``), shape and dtype, and bytes, in the order the graph takes them."""
    from mlsys_jax.ir.trace import aval_bytes, shape_str

    return [{"name": v.name, "kind": v.kind, "shape": shape_str(var.aval),
             "bytes": aval_bytes(var.aval)}
            for var, v in sorted(variables.items(), key=lambda kv: kv[1].index)]


def compute(user, args, progress=None) -> InspectRun:
    """The computing part of ``inspect``, shared by :func:`main` and the Python API
    (``mlsys_jax.inspect``): trace ``user`` (a ``cli.target.Target``), cost it, and measure it
    when ``args`` asks; ``progress`` (a ``progress.Progress``, or None: silent) names each
    stage as it starts."""
    from mlsys_jax.cli.headline import estimates
    from mlsys_jax.cli.summary import summarize
    from mlsys_jax.cli.variables import STATE, graph_variables
    from mlsys_jax.progress import SILENT

    progress = progress or SILENT
    on_shapes = _on_shapes(user, args)
    progress.stage(f"tracing {user.name}")
    closed = user.trace(grad=args.grad)
    progress.stage("costing the graph: both estimates, per module")
    side = _compile_beside_kernels(closed, args, on_shapes)
    both = estimates(closed, args.hw, args.dtype)
    if side is not None:
        side.owner.side = None
    report = both.default if args.fused is None else both.fused if args.fused else both.unfused
    weights, variables = graph_variables(user, closed)
    state = frozenset(var for var, v in variables.items() if v.kind == STATE)
    summary = summarize(both, weights, args.depth, state)
    if args.measure:
        progress.stage("timing the function under jax.jit")
    measured = measure_whole(closed, user, args, report)
    xla, xla_error, probe, fused = None, "", None, None
    if on_shapes or args.xla:
        progress.stage("compiling with XLA for its cost and memory analysis (--no-xla skips)")
        probing = report.hardware.name == "cpu" and not on_shapes and not measured
        xla, xla_error, probe, fused = _xla(closed, user.inputs() if probing else None, side,
                                            report.measured)
    return InspectRun(closed, both, report, summary, measured, xla, on_shapes,
                      _count_equations(closed), variables, xla_error, probe, fused)


def main(args) -> int:
    from mlsys_jax.ir import to_dot

    for path, flag in ((args.dot, "--dot"), (args.plot, "--plot"), (args.trace, "--trace"),
                       (args.html, "--html")):
        if path:  # checked before the work, not after it
            runtime.check_output_file(path, flag)
    if args.plot:
        _require_plots()
    check_measure_options(args)
    from mlsys_jax.progress import SlowStages

    user = target.resolve(args)
    with SlowStages("mlsys-jax inspect", enabled=not args.quiet) as progress:
        done = compute(user, args, progress)
    closed, report, summary = done.closed, done.report, done.summary
    if args.dot:
        from mlsys_jax.cli.summary import weights_of

        Path(args.dot).write_text(to_dot(closed, name=user.name,
                                         weights=weights_of(user, closed)))
    if args.plot:
        _plot(args.plot, summary, report, args.ops, user.name)
    if args.trace or args.html:
        from mlsys_jax.cli.exports import write_inspect

        write_inspect(args, user.name, done, lambda: _print_tables(
            args, closed, done.both, report, summary, done.equations, done.measured, done.xla,
            probe_us=done.probe_us, fused=done.fused_contractions))
    if args.json:
        print(json.dumps(done.to_json(), indent=1))
        return 0
    if args.jaxpr:
        print(closed)
    _print_tables(args, closed, done.both, report, summary, done.equations, done.measured,
                  done.xla, xla_error=done.xla_error, probe_us=done.probe_us,
                  fused=done.fused_contractions)
    for path, what in ((args.dot, "DOT"), (args.plot, "roofline plot"), (args.trace, "trace"),
                       (args.html, "HTML page")):
        if path:
            print(f"{what} written to {path}")
    return 0


def _print_tables(args, closed, both, report, summary, equations: int, measured, xla, *,
                  xla_error: str = "", probe_us: float | None = None,
                  fused: list | None = None) -> None:
    from mlsys_jax.cli.headline import compiler_note, flop_convention
    from mlsys_jax.cli.measured import table_columns
    from mlsys_jax.cli.shapes import beside_table, why_line
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
        _print_modules(args, both, summary, equations, f"{hw.name}, {dtypes}")
    print("\n" + wrap(model_line(summary), first=""))
    print(beside_table(both, report, xla))
    if xla_error:
        print(wrap(f"XLA's figures: the compile failed here ({xla_error})", first=""))
    print(wrap(flop_convention(), first=""))
    why = why_line(both.unfused.total_flops, xla, summary, closed) if xla else None
    if why:
        print(wrap(why, first=""))
    print(wrap(f"estimate: {estimate_line(both)}", first=""))
    print(wrap(compiler_note(hw), first=""))
    print_measured(report, measured, probe_us)
    if fused:
        from mlsys_jax.cli.measured import fused_contractions_line

        print(wrap(fused_contractions_line(fused), first=""))
    if report.unknown:
        print(wrap("unknown primitives (no cost rule, counted as 0 FLOPs): "
                   f"{', '.join(report.unknown)}", first=""))
    if report.uncounted_loops:
        print(wrap(f"FLOPs are a lower bound: {report.uncounted_loops} while loop(s) of unknown "
                   "trip count (the program does not fix it), each body counted once", first=""))


def estimate_line(both) -> str:
    """Both estimates in one line; on a measured model, how each set got its times: the table's
    set is measured, the other derived from it where the cache does not have its kernels."""
    if both.unfused.hardware.timer is None:
        return both.line()
    parts = []
    for label, r in (("one call per op (eager)", both.unfused),
                     ("XLA's fused kernels", both.fused)):
        n, derived = len(r.kernels), sum(k.model == "derived" for k in r.kernels)
        how = (f"measured: {n - derived} of {n} kernels, {derived} derived from the table's"
               if derived else "measured")
        parts.append(f"{label}, {how}: {len(r.kernels)} kernels, {r.time_us:.4g} µs")
    return " · ".join(parts)


def _print_modules(args, both, summary, equations: int, where: str) -> None:
    """The module table, fitted to the terminal (optional columns left out, and named), and
    what its rows mean."""
    from mlsys_jax.cli.summary import fit_table, text_rows
    from mlsys_jax.tables import wrap

    name = f" of {'/'.join(summary.root)}" if summary.root else ""
    title = wrap(f"[modules{name}: share, bytes and bound of the {both.default_label} "
                 f"estimate; {where}]", first="")
    text, left_out = fit_table(text_rows(summary), "\n" + title, summary.default_fused)
    print(text)
    levels = (f"{summary.depth} of {summary.levels} levels (--depth N); "
              if summary.levels > 1 else "")
    hidden = (f"; left out to fit: {', '.join(left_out)} (--json has all)" if left_out else "")
    jaxpr = "" if args.jaxpr else f"; --jaxpr: the jaxpr ({equations:,} equations)"
    print(wrap(f"{levels}rows below a module sum to it, a kernel spanning modules counts in "
               f"their innermost common one; in/out: first input/output shape (+N more)"
               f"{hidden}. --ops: one row per kernel{jaxpr}", first="  "))


def model_line(summary) -> str:
    """The model's inputs and outputs, and its parameters beside its state (running
    statistics, non-trainable variables), which are not parameters."""
    node = summary.node
    shapes = (f"{', '.join(node.inputs) or '()'} -> {', '.join(node.outputs) or '()'}"
              if node.inputs or node.outputs else "")
    name = "/".join(summary.root) or "the function"
    parts = [f"{name}: {shapes}" if shapes else name]
    if node.params:
        parts.append(f"{node.params:,} parameters ({node.param_bytes / 1e6:.4g} MB)")
    if node.state:
        parts.append(f"state {node.state:,} ({node.state_bytes / 1e6:.4g} MB: batch "
                     "statistics, non-trainable variables)")
    return "; ".join(parts)




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
        print(shapes.notice())
    return True


def _compile_beside_kernels(closed, args, on_shapes: bool):
    """On ``--hw here`` with XLA's figures asked for: the whole program's compile handed to the
    measured model, to run beside its first kernel compiles (a ``SideWork``, with ``owner``)."""
    if args.hw.strip().lower() != "here" or on_shapes or not args.xla:
        return None
    from mlsys_jax.cost.here.operators import SideWork, operator_model
    from mlsys_jax.cost.xla import compile_on_shapes

    side = SideWork(lambda: compile_on_shapes(closed))
    side.owner = operator_model()
    side.owner.side = side
    return side


def _xla(closed, inputs=None, side=None, measured: bool = False) -> tuple:
    """XLA's figures of the function, compiled on its avals (nothing allocated; ``side``: that
    compile, started beside the measured model's kernels), '', given ``inputs`` a quick probe
    of the compiled program on them (µs, else None), and on a ``measured`` model the kernels
    where XLA runs several contractions as one (else None) — or None and why, when XLA cannot
    compile it here (the figures are a cross-check: the rest of the report stands without
    them)."""
    from mlsys_jax.cli.measured import quick_probe_us
    from mlsys_jax.cost.xla import compile_on_shapes, fused_contractions, xla_figures

    try:
        compiled = side.result() if side is not None else compile_on_shapes(closed)
        figures = xla_figures(closed, compiled)
    except Exception as e:  # noqa: BLE001 - XLA's error, reported in one line beside the tables
        text = str(e).strip().splitlines()
        return None, f"{type(e).__name__}: {text[0] if text else ''}", None, None
    try:
        probe = None if inputs is None else quick_probe_us(compiled, inputs)
    except Exception:  # noqa: BLE001 - the probe only decides whether a hint is printed
        probe = None
    return figures, "", probe, fused_contractions(compiled) if measured else None


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
    if args.hw.strip().lower() == "here":  # measure the set the table shows, derive the other
        from mlsys_jax.cost.here.operators import operator_model

        operator_model().shown = True if args.fused is None else args.fused


def measure_whole(closed, user, args, report):
    """With ``--measure``: the function timed under ``jax.jit`` on its example (or seeded random)
    inputs, as ``(the --json dict, the Timing)``; else None."""
    from mlsys_jax.cli.measured import measured_dict, time_whole

    if not args.measure:
        return None
    t = time_whole(closed, user.inputs(), args.rounds)
    return measured_dict(report.time_us, t), t


def print_measured(report, measured, probe_us: float | None = None) -> None:
    from mlsys_jax.cli.headline import other_machine_note
    from mlsys_jax.cli.measured import efficiency_line, prediction_line, roofline_hint
    from mlsys_jax.tables import wrap

    line = efficiency_line(report)
    if line:
        print(wrap(line, first=""))
    if measured:
        hw = report.hardware.name
        print(wrap(prediction_line("whole function", f"{hw}, the table's estimate",
                                   report.time_us, measured[1]) + other_machine_note(hw),
                   first=""))
    hint = (roofline_hint(report, measured[1].median_us, measured=True) if measured
            else roofline_hint(report, probe_us))
    if hint:
        print(wrap(hint, first=""))


def _input_dtypes(closed) -> list[str]:
    """The dtypes of the graph's inputs and constants (``f32``, ``key<fry>``), for the title."""
    from mlsys_jax.cost.model import dtype_name

    avals = [v.aval for v in closed.jaxpr.invars + closed.jaxpr.constvars]
    return list(dict.fromkeys(dtype_name(a.dtype) for a in avals if hasattr(a, "dtype")))
