"""``mlsys-jax plan FILE.py:FN --devices N [--gpus-per-node G] [--hw h100|h200|a100]
[--memory 80GB] [--global-batch B] [--microbatches M] [--json] [--emit LAYOUT.json]
[--validate [FN_SMALL]]``: how to split the step over N GPUs (``mlsys_jax.planning``).

FN is a ``shard`` factory ``(loss_fn, params, batch, optimizer[, rules])``, on arrays or shapes
(only shapes are read). The command compiles on N simulated CPU devices (``--devices`` sets
them before JAX starts), prints the compiled layouts, the chosen one and why, every refused one
with its reason, and with ``--emit`` writes the layout as data (docs/plan.md).
"""
from __future__ import annotations

import json

from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch, optimizer[, rules])"
HELP = "how to split your training step over N GPUs: layouts searched, compiled, validated"


def add_arguments(q) -> None:
    q.add_argument("target", metavar="FILE.py:FN", help=f"a factory returning {FORM}")
    q.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                   help="GPUs per node: tensor parallelism stays inside one (default 8)")
    q.add_argument("--hw", default="h100", choices=("h100", "h200", "a100"),
                   help="the GPU: its compute, memory bandwidth and links (default h100)")
    q.add_argument("--memory", default="80GB", metavar="BYTES",
                   help="memory per GPU: 80GB = 80e9 bytes, 80GiB = 80*2^30 (default 80GB)")
    q.add_argument("--global-batch", type=int, default=None, metavar="B",
                   help="rows per step over all devices (default: the factory's batch)")
    q.add_argument("--microbatches", type=int, default=None, metavar="M",
                   help="pipelined layouts: microbatches per step (default: 1, 2, 4 x stages)")
    q.add_argument("--shortlist", type=int, default=8, metavar="K",
                   help="layouts compiled after the estimate (default 8)")
    q.add_argument("--emit", default=None, metavar="LAYOUT.json",
                   help="write the chosen layout as data (mlsys-jax shard --layout reads it)")
    q.add_argument("--validate", nargs="?", const="", default=None, metavar="FN_SMALL",
                   help="run the chosen layout here through shard: on the model itself, or on "
                        "FN_SMALL in the same file (the model, smaller)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _memory(text: str) -> int:
    from mlsys_jax.remat.planner.budget import parse_budget

    try:
        budget = parse_budget(text)
    except MlsysError:
        budget = None
    if budget is None or budget.kind != "bytes" or budget.value <= 0:
        raise MlsysError(f"--memory: expected bytes per GPU such as 80GB (80e9) or 80GiB, got "
                         f"{text!r}")
    return int(budget.value)


def main(args) -> int:
    import jax

    from mlsys_jax.cli.commands.shard import load_factory
    from mlsys_jax.planning.search import check_request, plan
    from mlsys_jax.progress import Progress

    if args.devices is None:
        raise MlsysError("plan needs --devices N: the number of GPUs to plan for (the same "
                         "number of CPU devices is simulated)")
    memory = _memory(args.memory)
    check_request(devices=args.devices, gpus_per_node=args.gpus_per_node, hw=args.hw,
                  memory_bytes=memory)
    if args.emit:
        from mlsys_jax import runtime

        runtime.check_output_file(args.emit, "--emit")
    progress = Progress("mlsys-jax plan", enabled=not args.quiet)
    try:
        with jax.enable_x64(False):
            progress.stage(f"loading {args.target} (the factory builds the model)")
            loss_fn, params, batch, optimizer, rules = load_factory(args.target)
            result = plan(loss_fn, params, batch, optimizer, rules, devices=args.devices,
                          gpus_per_node=args.gpus_per_node, hw=args.hw, memory_bytes=memory,
                          global_batch=args.global_batch, microbatches=args.microbatches,
                          shortlist=args.shortlist, progress=progress)
            layout = result.layout_data() if result.chosen is not None else None
            checked = None
            if args.validate is not None and layout is not None:
                checked = _validate(args, layout, (loss_fn, params, batch, optimizer), progress)
    finally:
        progress.done()
    if args.emit and layout is not None:
        from mlsys_jax.planning import layout_file

        layout_file.write(args.emit, layout)
    out = result.to_json()
    out["layout"] = layout
    out["validation"] = checked.to_json() if checked else None
    if args.json:
        print(json.dumps(out, indent=1, default=str))
    else:
        print(render(args.target, result, checked))
        if args.emit and layout is not None:
            print(f"layout written: {args.emit} (mlsys-jax shard FILE.py:FN --layout "
                  f"{args.emit})")
    if result.chosen is None:
        return 1
    return 0 if checked is None or (checked.exact and checked.bytes_equal is not False) else 1


def _validate(args, layout: dict, factory: tuple, progress):
    from mlsys_jax.cli.commands.shard import load_factory
    from mlsys_jax.planning.validate import validate

    if args.validate:
        file = args.target.rsplit(":", 1)[0]
        target = f"{file}:{args.validate}"
        progress.stage(f"validating on {target}")
        loss_fn, params, batch, optimizer, _ = load_factory(target)
    else:
        target = args.target
        loss_fn, params, batch, optimizer = factory
    return validate(layout, loss_fn, params, batch, optimizer, target=target, progress=progress)


def render(target: str, result, checked=None) -> str:
    """The plan as text: the chosen layout and why, the compiled ones, the refused ones."""
    from mlsys_jax.planning.assess import OVERLAP
    from mlsys_jax.planning.links import LINKS, size as gb
    from mlsys_jax.tables import format_table, wrap

    f, links = result.facts, LINKS[result.hw]
    lines = [wrap(f"plan {target}: {result.devices} x {result.hw} ({gb(result.memory_bytes)} "
                  f"each, {result.gpus_per_node} per node), global batch "
                  f"{result.global_batch}; {f.n_params:,} parameters ({gb(f.param_bytes)} in "
                  f"{f.dtype}); on shapes: compiled on simulated devices, not run", first="")]
    best = result.best
    if best is None:
        lines.append(wrap("no layout fits: " + result.why, first=""))
    else:
        c = best.candidate
        lines.append(wrap(f"chosen: {c.label()} — {gb(best.bytes)} per device as compiled, "
                          f"predicted step {best.predicted_step_s:.4g} s (compute "
                          f"{best.compute_s:.3g} s + communication {best.comm_s:.3g} s), MFU "
                          f"<= {best.mfu_bound:.1%}; why: {result.why}", first=""))
    rows = [{"layout": a.candidate.label(), "per device (XLA)": gb(a.bytes),
             "estimated": gb(a.estimate["total_bytes"]), "fits": a.fits,
             "step s (bound)": f"{a.predicted_step_s:.4g}",
             "comm s": f"{a.comm_s:.3g}", "MFU <=": f"{a.mfu_bound:.1%}",
             "pareto": i in result.pareto, "chosen": i == result.chosen,
             "compile s": f"{a.compile_s:.1f}"}
            for i, a in enumerate(result.assessed) if a.compiled]
    lines.append(format_table(rows, title="\n[compiled layouts: XLA's per-device bytes "
                                          "(arguments + outputs - aliased + temp, XLA:CPU's "
                                          "temp), the step-time bound]"))
    refused = [a for a in result.assessed if a.reason and a.candidate.pipe == 1]
    lines.append(f"\n[refused layouts: {len(refused)}]")
    lines += [wrap(f"{a.candidate.label()}: {a.reason}", first="  ", rest="    ")
              for a in refused]
    estimated = [a for a in result.assessed if not a.compiled and not a.reason]
    if estimated:
        lines.append("\n" + wrap(f"[{len(estimated)} layouts that fit by the estimate, not "
                                "compiled (--json lists them with their figures)]", first="",
                                rest=" "))
    lines.append(wrap(f"model: compute at the {result.hw} roofline (the per-kernel model, "
                      f"fused, {f.dtype}); links {links.intra_bytes_s / 1e9:g} GB/s inside a "
                      f"node, {links.inter_bytes_s / 1e9:g} GB/s across (per GPU, one direction: "
                      f"{links.source}); latency {links.intra_latency_s * 1e6:g}/"
                      f"{links.inter_latency_s * 1e6:g} us per ring step (assumed); overlap: "
                      f"{OVERLAP}", first=""))
    if checked is not None:
        lines.append(wrap(
            f"validated on {checked.target} ({', '.join(f'{k}={v}' for k, v in checked.mesh.items())}"
            f"): exact: {'yes' if checked.exact else 'NO'} ({checked.reason}); " + (
                "placed bytes not compared (a pipeline's state lives in flat buffers padded to "
                "its largest stage)" if checked.bytes_equal is None else
                f"state placed per device {checked.placed} vs planned {checked.planned}: "
                f"{'equal' if checked.bytes_equal else 'DIFFERENT'}"), first=""))
    return "\n".join(lines)

