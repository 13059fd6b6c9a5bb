"""Files the commands write beside their report: ``--trace OUT.json`` (Chrome trace events,
:mod:`mlsys_jax.viz.trace`) of ``shard --mesh [data=D,]pipe=P``, ``remat`` and ``inspect``, and
``inspect --html OUT.html`` (:mod:`mlsys_jax.viz.html`). Each turns what its command computed
into rows; none computes a figure of its own. The output paths are checked by the commands
before their work (``runtime.check_output_file``)."""
from __future__ import annotations

import contextlib
import io

from mlsys_jax.tables import wrap
from mlsys_jax.viz import trace


# ---- shard --mesh [data=D,]pipe=P --trace -----------------------------------------------------

def pipeline_trace(path: str, target: str, report) -> str:
    """The executed schedule of a ``PipelineReport``: one track per stage and device, one slice
    per slot (forward, backward, bubble); returns the line the command prints."""
    name = (f"{target}: {report.schedule}, P={len(report.stages)}, M={report.microbatches}")
    events = trace.pipeline_events(report.timeline, devices=device_grid(report.mesh),
                                   stage_us=[s["estimated_us"] for s in report.stages],
                                   title=name)
    bubble = report.bubble["executed"]
    trace.write(path, events, other={
        "command": "mlsys-jax shard", "target": target, "schedule": report.schedule,
        "microbatches": report.microbatches, "mesh": report.mesh, "time": trace.SLOT_TIME,
        "bubble (executed)": f"{bubble.numerator}/{bubble.denominator}"})
    return written(path, "one track per stage; the times are schedule slots")


def device_grid(shape: dict) -> list[list[int]]:
    """The device ids of the pipeline's mesh (``parallel.mesh.make_mesh`` of the same shape, as
    the run built it), as ``[data replica][stage]``."""
    from mlsys_jax.parallel.mesh import make_mesh

    mesh = make_mesh(shape)
    names = list(mesh.axis_names)
    grid = mesh.devices
    if "data" in names:
        grid = grid.transpose(names.index("data"), names.index("pipe"))
    else:
        grid = grid.reshape(1, -1)
    return [[int(d.id) for d in row] for row in grid]


def written(path: str, what: str) -> str:
    """The command's note: the path on a line of its own (whole, to copy), then what it holds."""
    return f"trace written: {path}\n" + wrap(f"{what}; open it in ui.perfetto.dev or "
                                             "chrome://tracing")


# ---- remat --trace ----------------------------------------------------------------------------

def remat_trace(path: str, target: str, out) -> str:
    """The memory timelines of a ``PlanReport`` (no remat, and the plan when the planner's
    model covers it) as counter tracks; the budget and compiled bytes in ``otherData``."""
    events = trace.memory_events(out.timelines, title=f"{target}: activation bytes held (the "
                                                      "planner's model)")
    p = out.plan
    other = {"command": "mlsys-jax remat", "target": target, "time": trace.POSITION_TIME,
             "budget (XLA temp bytes)": out.budget_bytes,
             "no remat, compiled temp bytes": out.no_remat.compiled_temp_bytes,
             "the plan, compiled temp bytes": p.compiled_temp_bytes}
    trace.write(path, events, other=other)
    series = " and ".join(out.timelines)
    return written(path, f"counter tracks: {series}")


# ---- inspect --trace, --html ------------------------------------------------------------------

def write_inspect(args, name: str, done, print_tables) -> None:
    """``inspect``'s ``--trace`` and ``--html`` of one run (``inspect.InspectRun``);
    ``print_tables()`` prints the tables the terminal shows (captured for the page)."""
    if args.trace:
        inspect_trace(args.trace, done.report, done.summary, done.measured)
    if args.html:
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            print_tables()
        inspect_html(args.html, name, done, text.getvalue(), per_kernel=args.ops)


def kernel_rows(report, summary) -> list[dict]:
    """One row per kernel of the table's estimate: its module, time and what the time is."""
    from mlsys_jax.cli.measured import kernel_fields

    modules = summary.placed["fused" if report.fused else "unfused"]
    return [{"name": k.name, "module": "/".join(m), "time_us": k.time_us,
             "time": _time_is(report, k), "flops": k.flops, "bytes": k.bytes, "bound": k.bound,
             "primitives": ", ".join(k.primitives), **kernel_fields(report, k)}
            for k, m in zip(report.kernels, modules)]


def _time_is(report, k) -> str:
    hw = report.hardware.name
    if not report.measured or k.model == "roofline":
        why = f" ({k.why})" if k.why else ""
        return f"estimated: roofline of {hw}{why}"
    return "measured here" + (", from the cache" if k.model == "cached" else "")


def inspect_trace(path: str, report, summary, measured) -> str:
    """The kernels one after another on one track (estimated, or measured with ``--hw here``),
    and with ``--measure`` the whole function's measured time on a second track."""
    hw = report.hardware.name
    kind = "fused" if report.fused else "one per op"
    extra = {}
    if measured:
        timing = measured[1]
        extra = {"measured_us": timing.median_us,
                 "measured_what": f"whole function under jax.jit, measured here (median of "
                                  f"{timing.repeats} rounds)"}
    events = trace.kernel_events(kernel_rows(report, summary), track=f"kernels ({kind}; {hw})",
                                 **extra)
    return trace.write(path, events, other={"command": "mlsys-jax inspect", "hardware": hw,
                                            "estimate (µs)": report.time_us})


def inspect_html(path: str, name: str, done, text: str, *, per_kernel: bool) -> str:
    """One page: the module tree, the module and kernel tables, the roofline chart (embedded
    when matplotlib is installed) and the report as printed."""
    from mlsys_jax.viz import html

    report, summary = done.report, done.summary
    hw = report.hardware
    columns = ("name", "in", "out", "flops", "bytes", "intensity", "bound", "time_us")
    kernels = [{k: r[k] for k in columns + ("model", "x_roofline") if k in r}
               for r in report.rows()]
    parts = [html.paragraph(f"{len(report.kernels)} kernels on {hw.name}; estimate "
                            f"{report.time_us:.4g} µs"),
             html.heading("Module tree"), html.tree(module_tree(summary)),
             html.heading("Modules"), html.table(module_rows(summary)),
             html.heading("Kernels"), html.table(kernels),
             html.heading("Roofline")]
    png = html.png_of(lambda p: _roofline(p, summary, report, per_kernel, name))
    if png:
        parts.append(html.image(png, f"roofline of {name} on {hw.name}"))
    else:
        from mlsys_jax.viz.plots import unavailable_reason

        parts.append(html.paragraph(unavailable_reason() or "no roofline drawn", note=True))
    parts += [html.heading("Report as printed"), html.pre(text)]
    return html.write(path, html.page(f"mlsys-jax inspect {name}", parts))


def module_rows(summary) -> list[dict]:
    """The module table as the terminal shows it, its indentation kept (no-break spaces)."""
    from mlsys_jax.cli.summary import text_rows

    rows = text_rows(summary)
    for r in rows:
        name = r["module"]
        r["module"] = "\u00a0" * (len(name) - len(name.lstrip(" "))) + name.lstrip(" ")
    return rows


def module_tree(summary) -> list[tuple]:
    """Every module of the tree, ``(text, children)``: its time, share and parameters."""
    from mlsys_jax.cli.summary import figure
    from mlsys_jax.cost.modules import listing

    fused = summary.default_fused
    total = (summary.node.fused_us if fused else summary.node.unfused_us) or 1.0

    def node(name: str, c) -> tuple:
        us = c.fused_us if fused else c.unfused_us
        params = f", {c.params:,} parameters" if c.params else ""
        children = [] if name == "(self)" else [node(n, k) for n, k in listing(c)]
        return f"{name}: {figure(us)} µs ({us / total:.1%}){params}", children
    root = "/".join(summary.root) or "(program)"
    return [node(root, summary.node)]


def _roofline(path: str, summary, report, per_kernel: bool, name: str):
    from mlsys_jax.viz.roofline import points_of_kernels, points_of_rows, roofline

    points = points_of_kernels(report) if per_kernel else points_of_rows(
        summary.leaves(), summary.default_fused)
    what = "kernel" if per_kernel else "module"
    return roofline(path, points, report.hardware,
                    title=f"{name} on {report.hardware.name}: one marker per {what}")
