"""``mlsys-jax shard FILE.py:FN --mesh data=N[,model=M] [--zero 0-3] [--steps S] [--processes P]``
(``--mesh [data=D,]pipe=P``: pipeline stages, ``cli/commands/shard_pipe.py``).

FN is an example factory returning ``(loss_fn, params, batch, optimizer[, rules])``: rules are
``(regex, PartitionSpec)`` pairs or logical axis rules (``--axis-rules`` gives the latter too).
The user's step runs S steps sharded (``mlsys_jax.parallel.shard``) and on one device; the
command prints whether it is exact (and why not), the differences beside the noise of an
equivalent one-device computation, per-device bytes beside ZeRO's formula, the collectives beside
their formulas and which parameters the model axis splits. ``--processes P`` also runs the sharded
steps across P local processes (``jax.distributed``, gloo) and compares them with this run.
``--time`` also times the sharded step against one device's; without it no timing round runs
(the verdict needs no wall-clock) and the report says the time was not measured.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile

import numpy as np

from mlsys_jax.cli.commands import shard_pipe
from mlsys_jax.cli.target import load_factory as load_factory_as
from mlsys_jax.cli.target import target_name
from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.stages import STAGE_NUMBERS, STAGES

FORM = "(loss_fn, params, batch, optimizer[, rules])"
TIME_REPEATS = 5   # --time: paired rounds of the sharded step and one device's
HELP = "your training step on a simulated mesh (DP, ZeRO, TP, PP) against one device"


def add_arguments(q) -> None:
    q.add_argument("target", metavar="FILE.py:FN", help=f"a factory returning {FORM}")
    q.add_argument("--mesh", default=None, metavar="data=N[,model=M] | [data=D,]pipe=P",
                   help="mesh axes: data (batch, ZeRO) and model (tensor parallel), or pipe "
                        "(pipeline stages, with data)")
    q.add_argument("--layout", default=None, metavar="LAYOUT.json",
                   help="mesh, ZeRO stage, remat and parameter specs from a layout file "
                        "(mlsys-jax plan --emit) instead of --mesh/--zero")
    q.add_argument("--zero", type=int, default=None, choices=STAGE_NUMBERS,
                   help="ZeRO stage: " + "; ".join(f"{s.number} = {s.what}" for s in STAGES))
    q.add_argument("--steps", type=int, default=3, metavar="N",
                   help="training steps to compare (default 3)")
    q.add_argument("--processes", type=int, default=1, metavar="P",
                   help="also run across P local processes (jax.distributed)")
    q.add_argument("--axis-rules", default=None, metavar="NAME=AXIS,...",
                   help="logical axis rules for the model's annotations, e.g. mlp=model,embed=")
    q.add_argument("--axis-name", action="append", default=[], metavar="NAME=data",
                   help="bind an axis name the model uses (BatchNorm(axis_name=...)) to data")
    q.add_argument("--time", action="store_true",
                   help="also time the sharded step against one device's (off by default: "
                        "the verdict needs no timing)")
    q.add_argument("--quick-compile", action="store_true",
                   help="compile every program of the run without XLA's backend optimisation "
                        "(faster for small models; all programs alike)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    shard_pipe.add_arguments(q)


def parse_mesh(text: str) -> dict:
    """``"data=2,model=2"`` -> ``{"data": 2, "model": 2}`` (one-line errors)."""
    out = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise MlsysError(f"--mesh: expected data=N[,model=M] with sizes >= 1, got {text!r}")
        if name.strip() in out:
            raise MlsysError(f"--mesh {text}: axis {name.strip()!r} is given twice; give each "
                             "axis once, e.g. --mesh data=4,model=2")
        out[name.strip()] = int(value)
    return out


def parse_axis_names(pairs: list) -> dict:
    out = {}
    for pair in pairs:
        name, sep, axis = pair.partition("=")
        if not sep or not name.strip() or not axis.strip():
            raise MlsysError(f"--axis-name: expected NAME=data (the model's axis name, then the "
                             f"mesh axis it means), got {pair!r}")
        out[name.strip()] = axis.strip()
    return out


def load_factory(target: str) -> tuple:
    """The shared loader (``cli.target.load_factory``: ``FILE.py:FN`` or the factory itself),
    then the optimizer's type: ``(loss_fn, params, batch, optimizer, rules)``."""
    import optax

    loss_fn, params, batch, optimizer, rules = load_factory_as(target, FORM)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise MlsysError(f"{target_name(target)}: the 4th item must be an optax "
                         f"GradientTransformation (e.g. optax.adamw(1e-3)), got "
                         f"{type(optimizer).__name__}")
    return loss_fn, params, batch, optimizer, rules


def _check_devices(mesh: dict, processes: int) -> None:
    import jax

    size, have = int(np.prod(list(mesh.values()))), jax.device_count()
    layout = ",".join(f"{k}={v}" for k, v in mesh.items())
    if have % size:
        raise MlsysError(f"--mesh {layout} uses {size} devices, which does not divide the {have} "
                         f"simulated devices; use --devices {size} (or a multiple) or a mesh "
                         f"whose size divides {have}")
    if processes != 1 and (processes < 2 or size % processes):
        raise MlsysError(f"--processes {processes}: the mesh's {size} devices must split evenly "
                         f"over >= 2 processes; use --processes P with P dividing {size}")


def _mesh_and_layout(args) -> dict:
    """The mesh from ``--mesh``, or from ``--layout`` (which also sets the ZeRO stage); a
    pipeline mesh refuses ``--time`` (that path reports its executed schedule)."""
    mesh = _read_mesh(args)
    if "pipe" in mesh and getattr(args, "time", False):
        raise MlsysError("--time: the pipeline path (--mesh ...,pipe=P) reports its executed "
                         "schedule, not wall-clock; drop --time")
    return mesh


def _read_mesh(args) -> dict:
    args.layout_data = None
    if args.layout is None:
        if args.mesh is None:
            raise MlsysError("shard needs --mesh data=N[,model=M] (or --layout LAYOUT.json from "
                             "mlsys-jax plan --emit)")
        args.zero = 0 if args.zero is None else args.zero
        return parse_mesh(args.mesh)
    from mlsys_jax.planning import layout_file

    if args.mesh is not None or args.zero is not None:
        raise MlsysError("--layout sets the mesh and the ZeRO stage: give --layout alone, or "
                         "--mesh/--zero without it")
    args.layout_data = data = layout_file.read(args.layout)
    args.zero = data["zero"]
    if "pipeline" in data:               # the pipeline path: stages, microbatches, schedule
        from mlsys_jax.planning.candidates import STAGE_REMAT

        given = [f"--{k}" for k in shard_pipe.PIPE_ONLY if getattr(args, k) not in (None, False)]
        if given:
            raise MlsysError(f"{given[0]}: --layout {args.layout} sets the pipeline")
        pipe = data["pipeline"]
        args.microbatches, args.schedule = pipe["microbatches"], pipe["schedule"]
        args.split = ",".join(pipe["split"]) if pipe.get("split") else None
        args.remat = data.get("remat") == STAGE_REMAT
        args.layout_data = None          # the pipeline keeps each stage's state whole
    return dict(data["mesh"])


def _apply_layout(args, loss_fn, params, batch, optimizer, mesh: dict):
    """``(loss_fn, rules)`` under the layout file: its remat applied, its tensor-parallel rules;
    its per-parameter specs checked against the layout ``shard`` makes of them."""
    from mlsys_jax.parallel.shard.setup import prepare
    from mlsys_jax.planning import layout_file
    from mlsys_jax.planning.remat import with_remat

    data = args.layout_data
    loss_fn = with_remat(loss_fn, params, data.get("remat"))
    rules = layout_file.tp_rules(data)
    lay = prepare(loss_fn, params, batch, optimizer, mesh, args.zero, rules=rules).layout
    layout_file.check_held(data, lay.kept_specs, args.layout)
    return loss_fn, rules


def _compile_options(args) -> dict | None:
    from mlsys_jax.parallel import comm

    return comm.QUICK_COMPILE if getattr(args, "quick_compile", False) else None


def _options(args) -> dict:
    from mlsys_jax.parallel.shard.annotations import parse_axis_rules

    rules = parse_axis_rules(args.axis_rules) if args.axis_rules else None
    return {"axis_rules": tuple(rules) if rules else None,
            "axis_names": parse_axis_names(args.axis_name) or None}


def main(args) -> int:
    import jax

    mesh = _mesh_and_layout(args)
    shard_pipe.check_flags(args, mesh)
    if "pipe" in mesh:
        return shard_pipe.main(args, mesh)
    out, on_shapes = compute(args, mesh)
    print(json.dumps(out, indent=1) if args.json else
          report_text(args.target, out, on_shapes, jax.device_count()))
    failed = args.processes > 1 and not out["processes"]["equal"]
    return 1 if failed else 0


def compute(args, mesh: dict) -> tuple[dict, bool]:
    """The computing part of ``shard`` on a data/model mesh, shared by :func:`main` and the
    Python API (``mlsys_jax.shard``): the ``--json`` object, and whether the factory returned
    shapes (the step compiled, not run). ``args.target`` is ``FILE.py:FN`` or the factory."""
    import jax

    from mlsys_jax.ir.abstract import is_abstract
    from mlsys_jax.parallel.shard import ShardOptions, simulate, step

    if args.steps < 1:
        raise MlsysError(f"--steps must be >= 1, got {args.steps}")
    _check_devices(mesh, args.processes)
    extra = _options(args)
    step.map_large_blocks()   # this process is the command's: freed steps go back at once
    record = tempfile.mkdtemp(prefix="mlsys-shard-") if args.processes > 1 else None
    try:
        # users' models run under JAX's defaults (float32); the CLI enables float64 for the lecture
        with jax.enable_x64(False):
            loss_fn, params, batch, optimizer, rules = load_factory(args.target)
            if args.layout_data is not None:
                loss_fn, rules = _apply_layout(args, loss_fn, params, batch, optimizer, mesh)
            if is_abstract((params, batch)):
                return _on_shapes(args, mesh, (loss_fn, params, batch, optimizer, rules),
                                  extra), True
            if record:
                _check_disk(params, args.steps, record)
            options = ShardOptions(zero=args.zero, steps=args.steps, record=record,
                                   xla_options=_compile_options(args),
                                   time_repeats=TIME_REPEATS if getattr(args, "time", False)
                                   else 0,
                                   progress=getattr(args, "progress", True), **extra)
            report = simulate(loss_fn, params, batch, optimizer, mesh, options, rules=rules)
        out = report.to_json()
        if args.processes > 1:
            out["processes"] = _compare_processes(args, mesh, report, record)
    finally:
        if record:
            shutil.rmtree(record, ignore_errors=True)
    return out, False


def report_text(target, out: dict, on_shapes: bool, devices: int) -> str:
    """The text report of :func:`compute`'s object (on shapes: without the notice, which
    :func:`_on_shapes` prints before the work)."""
    from mlsys_jax.cli import shapes
    from mlsys_jax.cli.shard_render import render
    from mlsys_jax.cli.target import target_name

    if on_shapes:
        return shapes.render_shard(target_name(target), out)
    return render(target_name(target), out, devices)


def _on_shapes(args, mesh: dict, factory: tuple, extra: dict) -> dict:
    """The step laid out and compiled on shapes: bytes per device and collectives, no run."""
    import sys

    from mlsys_jax.cli import shapes
    from mlsys_jax.parallel.shard.shapes import compile_on_shapes

    if args.processes > 1:
        shapes.refuse_values("--processes", "it compares runs of the step across processes")
    if getattr(args, "time", False):
        shapes.refuse_values("--time", "it times runs of the step")
    if not args.json:
        print(shapes.notice())
    loss_fn, params, batch, optimizer, rules = factory
    say = lambda text: print(f"mlsys-jax shard: {text}", file=sys.stderr, flush=True)  # noqa: E731
    report = compile_on_shapes(loss_fn, params, batch, optimizer, mesh, zero=args.zero,
                               rules=rules, options=_compile_options(args), progress=say, **extra)
    return report.to_json()


def _check_disk(params, steps: int, record: str) -> None:
    """Refuse up front a multi-process run whose recorded steps cannot fit on the disk: each
    teacher-forced step records parameters and gradients, each free-running step gradients, in
    this process's run and in the workers' (so memory stays flat in the step count)."""
    import jax

    from mlsys_jax.runtime import format_bytes

    floats = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params)
                 if hasattr(x, "dtype") and np.issubdtype(x.dtype, np.floating))
    need, free = 2 * 3 * floats * steps, shutil.disk_usage(record).free
    if need > free:
        raise MlsysError(f"--steps {steps} with --processes: both runs record every step, about "
                         f"{format_bytes(need)} on disk, more than the {format_bytes(free)} free "
                         f"under {tempfile.gettempdir()}; use fewer --steps")


def _compare_processes(args, mesh: dict, report, record: str) -> dict:
    """The same run across P processes: its teacher-forced steps (the same states as this
    process's) must equal this process's within the bounds of this run; the free-running drift
    is shown. Both runs write their values to disk step by step; they are compared leaf by leaf."""
    from mlsys_jax.parallel import multiprocess
    from mlsys_jax.parallel.shard import ShardOptions
    from mlsys_jax.parallel.shard.run import compare_recorded

    size = int(np.prod(list(mesh.values())))
    theirs = tempfile.mkdtemp(prefix="mlsys-shard-workers-")
    try:
        options = ShardOptions(zero=args.zero, steps=args.steps, record=theirs,
                               xla_options=_compile_options(args), time_repeats=0,
                               separable=report.separability.get("separable", True),
                               judge=False, **_options(args))
        settings = {"target": args.target, "mesh": mesh, "options": options.to_json()}
        many = multiprocess.launch(args.processes, size // args.processes, settings,
                                   timeout=600.0, module="mlsys_jax.cli.commands.shard")
        diff = compare_recorded(record, theirs)
    finally:
        shutil.rmtree(theirs, ignore_errors=True)
    forced = diff.get("forced", {})
    return {"count": args.processes, "devices_per_process": size // args.processes,
            "max_abs_diff": forced, "free_running_diff": diff.get("free", {}),
            "ranks_agree": many["ranks_agree"],
            "equal": many["ranks_agree"] and bool(forced) and all(
                forced.get(q, np.inf) <= report.bound[q] for q in report.bound)}


def worker_main(argv=None) -> int:
    """One process of ``--processes P``: the same run on the global mesh; process 0 records its
    values for the parent to compare."""
    from mlsys_jax.parallel import multiprocess

    return multiprocess.run_worker(_worker_steps, argv, x64=False)


def _worker_steps(a) -> dict:
    import jax

    from mlsys_jax.parallel.shard import ShardOptions, simulate, step

    step.map_large_blocks()
    cfg = json.loads(a.settings)
    loss_fn, params, batch, optimizer, rules = load_factory(cfg["target"])
    options = ShardOptions.from_json(cfg["options"])
    simulate(loss_fn, params, batch, optimizer, cfg["mesh"], options, rules=rules)
    return {"steps": options.steps, "processes": jax.process_count()}


if __name__ == "__main__":
    sys.exit(worker_main())
