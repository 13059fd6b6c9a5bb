"""``mlsys-jax shard FILE.py:FN --mesh [data=D,]pipe=P --microbatches M [--schedule gpipe|1f1b]
[--split a,b] [--remat] [--plot OUT.png] [--trace OUT.json]``: the user's step as P pipeline
stages.

The ``pipe`` path of the ``shard`` command (``cli/commands/shard.py`` dispatches here when the mesh has a
``pipe`` axis): ``mlsys_jax.parallel.pipe`` plans the stages, runs the steps on the mesh and
against one device, and this module prints the report (or ``--json``) and draws the executed
timeline (``--plot``; ``--trace``: Chrome trace events, ``cli/exports.py``).
"""
from __future__ import annotations

import json

from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch, optimizer)"
PIPE_ONLY = ("microbatches", "split", "remat", "plot")


def add_arguments(q) -> None:
    q.add_argument("--microbatches", type=int, default=None, metavar="M",
                   help="pipeline (--mesh ...pipe=P): microbatches per step, M >= P")
    q.add_argument("--schedule", default="1f1b", choices=("gpipe", "1f1b"),
                   help="pipeline: the schedule (default 1f1b)")
    q.add_argument("--split", default=None, metavar="UNIT,UNIT",
                   help="pipeline: the units that start stages 2..P (default: balanced by the "
                        "cost model)")
    q.add_argument("--remat", action="store_true",
                   help="pipeline: recompute each stage's activations in its backward")
    q.add_argument("--plot", default=None, metavar="OUT.png",
                   help="pipeline: the executed timeline (needs the plot extra)")
    q.add_argument("--trace", default=None, metavar="OUT.json",
                   help="pipeline: the executed schedule as Chrome trace events, one track per "
                        "stage (open in ui.perfetto.dev or chrome://tracing)")


def check_flags(args, mesh: dict) -> None:
    """Pipeline options only with a pipe axis; the rest of ``shard``'s options not with one."""
    given = [f"--{k}" for k in PIPE_ONLY + ("trace",) if getattr(args, k) not in (None, False)]
    if "pipe" not in mesh:
        if given:
            raise MlsysError(f"{given[0]} is a pipeline option: use it with --mesh "
                             "[data=D,]pipe=P")
        return
    if args.zero:
        raise MlsysError("--zero does not combine with pipe=P; run ZeRO on --mesh data=N")
    if args.axis_rules or args.axis_name:
        raise MlsysError(f"--{'axis-rules' if args.axis_rules else 'axis-name'} does not combine "
                         "with pipe=P (the stages come from the traced step; run tensor "
                         "parallelism on --mesh data=N,model=M)")
    if args.processes != 1:
        raise MlsysError("--processes does not combine with pipe=P (one process runs the "
                         "pipeline)")
    if args.microbatches is None:
        raise MlsysError(f"--mesh pipe={mesh['pipe']} needs --microbatches M with M >= "
                         f"{mesh['pipe']} (e.g. --microbatches {4 * mesh['pipe']})")
    if args.steps < 1:
        raise MlsysError(f"--steps must be >= 1, got {args.steps}")
    if args.plot:
        from mlsys_jax.runtime import check_output_file
        check_output_file(args.plot, "--plot")
    if args.trace:
        from mlsys_jax.runtime import check_output_file
        check_output_file(args.trace, "--trace")


def main(args, mesh: dict) -> int:
    import jax

    out, report = compute(args, mesh)
    note = write_plot(args.plot, args.target, report) if args.plot else None
    if args.trace:
        from mlsys_jax.cli.exports import pipeline_trace
        traced = pipeline_trace(args.trace, args.target, report)
        note = f"{note}\n{traced}" if note else traced
    if args.json:
        out.pop("timeline")
        print(json.dumps(out, indent=1))
    else:
        print(render(args.target, out, jax.device_count()))
        if note:
            print(note)
    return 0


def compute(args, mesh: dict) -> tuple[dict, object]:
    """The pipeline run, shared by :func:`main` and the Python API (``mlsys_jax.shard``): the
    ``--json`` object (with the executed ``timeline``) and the report it came from."""
    import jax

    from mlsys_jax.cli.target import load_factory
    from mlsys_jax.parallel.comm import QUICK_COMPILE
    from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline

    split = None if args.split is None else args.split.split(",")
    # every program (the mesh's and the one-device references alike) compiles as --quick-compile
    # does: a pipeline's program holds every stage's code, and XLA's backend optimisation of it
    # costs more time than these runs take
    with jax.enable_x64(False):  # the user's model runs under JAX's defaults (float32)
        loss_fn, params, batch, optimizer = load_factory(args.target, FORM)
        plan = plan_pipeline(loss_fn, params, batch, optimizer, mesh, args.microbatches,
                             schedule=args.schedule, split=split, remat=args.remat)
        report = run_pipeline(plan, args.steps, options=QUICK_COMPILE)
    return report.to_json(), report


def write_plot(path: str, target: str, report) -> str:
    from mlsys_jax.viz import plots

    name = f"{report.schedule}, P={len(report.stages)}, M={report.microbatches} (executed)"
    written = plots.schedule_grid(path, {name: report.timeline}, title=f"{target}: pipeline")
    return f"plot written: {written}" if written else plots.unavailable_reason()


def _b(x) -> str:
    """Bytes with thousands separators (blank when not measured)."""
    return "" if x is None else f"{x:,.0f}"


def _frac(b: dict) -> str:
    return f"{b['fraction']} = {b['value']:.1%}"


def render(target: str, out: dict, devices: int) -> str:
    """The text report (at most 120 columns)."""
    from mlsys_jax.tables import fmt, format_table, wrap

    mesh = ",".join(f"{k}={v}" for k, v in out["mesh"].items())
    stages = out["stages"]
    lines = [wrap(f"{target}: mesh {mesh}, {out['schedule']}, {out['microbatches']} "
                  f"microbatches{', --remat' if out['remat'] else ''}, {out['steps']} steps "
                  f"({devices} simulated CPU devices)", first=""), "",
             wrap(f"exact: {'yes' if out['exact'] else 'NO'} - {out['reason']}", first=""), ""]
    how = "at the given split points" if out["split_given"] else (
        f"balanced by the cost model's estimated time on {out['balance']['hw']}: the slowest "
        f"stage is {out['balance']['max_over_mean']:.3f}x the mean")
    lines.append(wrap(f"{len(out['units'])} units from {out['unit_source']}; {len(stages)} "
                      f"stages {how}", first=""))
    mem = {r["stage"]: r for r in out["memory"]["stages"]}
    rows = []
    for s, st in enumerate(stages):
        units = st["units"][0] if len(st["units"]) == 1 else \
            f"{st['units'][0]} .. {st['units'][-1]} ({len(st['units'])})"
        m = mem.get(s, {})
        rows.append({"stage": s + 1, "units": units, "est. µs": st["estimated_us"],
                     "params (B)": _b(st["params_bytes"]),
                     "optimizer (B)": _b(m.get("optimizer_state")),
                     "in flight": out["in_flight"]["executed"][s],
                     "stash (B)": _b(m.get("stash")),
                     "compiled temp (B)": _b(m.get("compiled_temp"))})
    lines += [format_table(rows, wrap("stages (est. µs: forward and backward of one microbatch; "
                                      "stash: in-flight microbatches x their saved activations "
                                      "and residuals; compiled temp: the stage's forward and "
                                      "backward compiled alone)", first="")), ""]
    diff = [{"": q, "max |Δ|": v["diff"], "noise": v["noise"], "bound": v["bound"]}
            for q, v in out["teacher_forced"].items() if q != "separability"]
    diff.append({"": "optimizer vs optax, same gradients", "max |Δ|":
                 out["optimizer_check"]["diff"], "noise": "", "bound":
                 out["optimizer_check"]["bound"]})
    off = " with dropout off" if (out.get("stochastic") or {}).get("compared_with") == \
        "dropout off" else ""
    lines += [format_table(diff, wrap(f"against one device{off}, teacher-forced step by step "
                                      "(noise: two equivalent one-device computations)",
                                      first="")),
              f"free-running after {out['steps']} steps: max |Δ params| "
              f"{fmt(out['max_abs_diff']['params'])}", ""]
    b, f = out["bubble"], out["in_flight"]
    lines.append(wrap(f"bubble (executed): {_frac(b['executed'])}; the table's "
                      f"{_frac(b['table'])}; (P-1)/(M+P-1) = {_frac(b['formula'])}; idle steps "
                      f"per stage {', '.join(map(str, b['idle_steps']))}", first=""))
    lines.append(wrap(f"in flight per stage (executed): {', '.join(map(str, f['executed']))} "
                      f"(the table's {', '.join(map(str, f['table']))}); stash rows allocated "
                      f"per device: {f['buffer_rows']}", first=""))
    p2p = out["p2p"]
    rows = [{"boundary": f"{r['boundary'] + 1}->{r['boundary'] + 2}",
             "values": ", ".join(r["values"]), "bytes/mb": _b(r["bytes"]),
             "sends f/b": f"{r['sends'][0]}/{r['sends'][1]}", "measured": _b(r["measured"]),
             "formula": _b(r["formula"])} for r in p2p["boundaries"]]
    lines += ["", format_table(rows, wrap(f"point-to-point bytes per step and pipeline (compiled "
                                          f"collective-permutes x the sends that ran; formula: "
                                          f"bytes x M forward + cotangents x M backward): "
                                          f"measured / formula = {fmt(p2p['ratio'])}", first=""))]
    pm, pad = out["memory"]["program"], out["memory"]["padded"]
    lines += ["", wrap(f"the SPMD program per device (XLA memory_analysis): arguments "
                       f"{_b(pm['arguments'])} B, outputs {_b(pm['outputs'])} B, temp "
                       f"{_b(pm['temp'])} B; every device holds the largest stage's buffers: "
                       f"parameters {_b(pad['params'])} B, optimizer state "
                       f"{_b(pad['optimizer_state'])} B, stash {pad['stash_rows']} rows x "
                       f"{_b(pad['stash_row'])} B", first="")]
    if out["stacked"]:
        st = out["stacked"]
        lines.append(wrap(f"stacked layers cut by rows: {_b(st['total'])} B in all; per stage "
                          f"{', '.join(_b(x) for x in st['per_stage'])} (largest / equal share "
                          f"= {fmt(st['max_over_equal_share'])})", first=""))
    if out["replica_spread"]:
        lines.append(f"replicated leaves differ between stages by {fmt(out['replica_spread'])}")
    lines += [wrap(f"note: {n}", first="") for n in out["notes"]]
    return "\n".join(lines).rstrip()
