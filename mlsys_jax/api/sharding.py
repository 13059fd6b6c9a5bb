"""``mlsys_jax.shard``: a training step on a simulated mesh against one device, from Python.

The command ``mlsys-jax shard`` (``cli/commands/shard.py``, ``shard_pipe.py``) does the work; this
module turns keywords into its options, runs it here when JAX has a device count the mesh
divides, and otherwise in a child process started with the mesh's devices
(:mod:`mlsys_jax.api.bridge`).
"""
from __future__ import annotations

import math

from mlsys_jax.api.bridge import display_name, importable, namespace, no_devices_line, run_cli
from mlsys_jax.api.result import ApiResult
from mlsys_jax.api.speak import Say, mesh_text, speaking
from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch, optimizer[, rules])"
FLAGS = {"mesh": Say("mesh", "pairs"), "zero": Say("zero"), "steps": Say("steps"),
         "layout": Say("layout"), "processes": Say("processes"),
         "axis-rules": Say("axis_rules"), "axis-name": Say("axis_names", "pairs"),
         "quick-compile": Say("quick_compile", "bool"), "time": Say("time", "bool"),
         "microbatches": Say("microbatches"),
         "schedule": Say("schedule"), "split": Say("split"), "remat": Say("remat", "bool"),
         "abstract": Say("abstract", "bool"), "json": Say("to_json()", "literal"),
         "plot": Say("plot", "literal")}


class ShardResult(ApiResult):
    """``mlsys_jax.shard``'s result: ``verdict`` (``yes``, ``NO``, ``NO in general (equal on
    this batch)``; None on shapes, where nothing runs), ``exact``, ``reason``, and every figure
    of ``mlsys-jax shard --json`` (``r["max_abs_diff"]``, ``r.to_json()``)."""

    command = "shard"
    flags = FLAGS

    def __init__(self, data: dict, *, name: str, devices: int, where: str):
        self.devices, self.where = devices, where
        super().__init__(data, name=name)

    @property
    def kind(self) -> str:
        """``mesh`` (data/model, run), ``pipe`` (pipeline stages, run) or ``shapes``."""
        if "pipe" in self._data["mesh"]:
            return "pipe"
        return "shapes" if self._data.get("executed") is False else "mesh"

    @property
    def exact(self) -> bool | None:
        return self._data.get("exact")

    @property
    def reason(self) -> str | None:
        return self._data.get("reason")

    @property
    def verdict(self) -> str | None:
        from mlsys_jax.cli.shard_render import exact_verdict

        if self.kind == "shapes":
            return None
        return exact_verdict(self._data) if self.kind == "mesh" else (
            "yes" if self._data["exact"] else "NO")

    def _text(self) -> str:
        from mlsys_jax.cli import shapes
        from mlsys_jax.cli.commands import shard, shard_pipe

        if self.kind == "pipe":
            return shard_pipe.render(self.name, self._data, self.devices)
        text = shard.report_text(self.name, self._data, self.kind == "shapes", self.devices)
        return f"{shapes.notice()}\n{text}" if self.kind == "shapes" else text

    def _lines(self) -> list[str]:
        d = self._data
        zero = "" if self.kind == "pipe" else f", ZeRO-{d['zero']}"
        steps = "" if self.kind == "shapes" else f", {d['steps']} steps"
        head = (f"shard {self.name}: mesh={d['mesh']}{zero}{steps} ({self.devices} "
                f"device{'s' if self.devices != 1 else ''}, {self.where})")
        if self.kind == "shapes":
            return [head, f"on shapes: compiled, not run; the largest device holds "
                          f"{d['per_device']['total_bytes']:,} bytes"]
        diffs = ", ".join(f"{q} {v:.3g}" for q, v in d["max_abs_diff"].items())
        return [head, f"exact: {self.verdict} - {d['reason']}", f"max |Δ| against one device "
                f"after {d['steps']} steps: {diffs}"]


def shard(target, *values, mesh: dict | None = None, zero: int | None = None, steps: int = 3,
          layout: str | None = None, processes: int = 1, axis_rules=None,
          axis_names: dict | None = None, quick_compile: bool = False, time: bool = False,
          microbatches: int | None = None, schedule: str = "1f1b", split=None,
          remat: bool = False, abstract: bool = False, progress: bool = True) -> ShardResult:
    """Run a training step sharded over ``mesh`` and on one device, and say whether they agree.

    ``target`` is a factory returning ``(loss_fn, params, batch, optimizer[, rules])`` — as
    ``"file.py:make"`` or the zero-argument function itself — or ``loss_fn`` followed by
    ``params, batch[, optimizer[, rules]]`` (optimizer default: ``optax.adamw(1e-3)``).
    ``mesh={"data": 4, "model": 2}`` (or ``{"data": 2, "pipe": 2}`` with ``microbatches``), or
    ``layout="LAYOUT.json"`` from ``mlsys-jax plan --emit``; the other keywords are the
    command's flags (``mlsys-jax shard --help``). Runs here when JAX's device count is a
    multiple of the mesh's size, else in a child process with that many simulated devices,
    which loads the factory from its file.
    """
    given = dict(mesh=mesh, zero=zero, steps=steps, layout=layout, processes=processes,
                 microbatches=microbatches, schedule=schedule)
    with speaking(FLAGS, given):
        _check_keywords(mesh, zero, steps, processes)
        factory, path = _factory(target, values)
        size = _mesh_size(mesh, layout)
        name = display_name(target)
        options = dict(mesh=mesh_text(mesh) if mesh else None, layout=layout, zero=zero,
                       steps=steps, processes=processes, axis_rules=_axis_rules(axis_rules),
                       axis_name=[f"{k}={v}" for k, v in (axis_names or {}).items()],
                       quick_compile=quick_compile, time=time, microbatches=microbatches,
                       schedule=schedule, split=",".join(split) if isinstance(
                           split, (list, tuple)) else split, remat=remat, abstract=abstract)
        import jax

        have = jax.device_count()
        if have % size == 0 and (processes == 1 or path is not None):
            target = factory if processes == 1 else path
            data = _here(namespace("shard", target=target, json=True, progress=progress,
                                   **options))
            return ShardResult(data, name=name, devices=have, where="in this process")
        if path is None:
            raise MlsysError(no_devices_line(f"shard(mesh={mesh or layout!r})", size, have,
                                             FORM) if have % size else
                             f"shard(processes={processes}): the worker processes import the "
                             f"factory; pass 'file.py:make' or a function defined in a module "
                             f"file, returning {FORM}")
        data, _ = run_cli(["shard", path, *_argv(options)], devices=size, flags=FLAGS,
                          given=given, progress=progress)
        return ShardResult(data, name=name, devices=size, where="in a child process")


def _check_keywords(mesh, zero, steps, processes) -> None:
    """What argparse checks on the command line (types, choices), said with the keywords."""
    from mlsys_jax.parallel.stages import STAGE_NUMBERS

    if mesh is not None and (not isinstance(mesh, dict) or not mesh or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 1
            for k, v in mesh.items())):
        raise MlsysError(f"mesh={mesh!r}: give axis sizes, e.g. mesh={{'data': 4}} or "
                         "{'data': 2, 'model': 2} (each size an int >= 1)")
    if zero is not None and zero not in STAGE_NUMBERS:
        raise MlsysError(f"zero={zero!r}: choose one of {', '.join(map(str, STAGE_NUMBERS))}")
    for key, value in (("steps", steps), ("processes", processes)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise MlsysError(f"{key}={value!r}: give a whole number")


def _factory(target, values: tuple):
    """(what the command loads in this process, ``FILE.py:FN`` for a child or None)."""
    if isinstance(target, str):
        if values:
            raise MlsysError(f"shard({target!r}, ...): a factory path takes no further "
                             f"positional arguments; its factory returns {FORM}")
        return target, target
    if not callable(target):
        raise MlsysError(f"shard: expected a factory ('file.py:make' or a function) or loss_fn, "
                         f"params, batch; got a {type(target).__name__}")
    if not values:
        return target, importable(target)
    if not 2 <= len(values) <= 4:
        raise MlsysError(f"shard(loss_fn, ...): give params, batch[, optimizer[, rules]] after "
                         f"loss_fn; got {len(values)} more value(s)")
    params, batch, *rest = values
    if not rest:
        import optax

        rest = [optax.adamw(1e-3)]
    step = (target, params, batch, *rest)

    def given_step():
        return step
    given_step.__qualname__ = display_name(target)
    return given_step, None


def _mesh_size(mesh: dict | None, layout: str | None) -> int:
    """Devices the mesh uses (the layout file's mesh with ``layout=``)."""
    if mesh is None and layout is not None:
        from mlsys_jax.planning import layout_file

        mesh = layout_file.read(layout)["mesh"]
    if mesh is None:
        raise MlsysError("shard needs mesh={'data': N} (or {'data': N, 'model': M}, or "
                         "{'data': D, 'pipe': P}), or layout='LAYOUT.json' from mlsys-jax plan "
                         "--emit")
    return math.prod(mesh.values())


def _axis_rules(rules) -> str | None:
    """``{"mlp": "model", "embed": None}`` or ``"mlp=model,embed="`` -> the command's text."""
    if rules is None or isinstance(rules, str):
        return rules
    if isinstance(rules, dict):
        return ",".join(f"{k}={v or ''}" for k, v in rules.items())
    raise MlsysError(f"axis_rules={rules!r}: give a dict {{'mlp': 'model', 'embed': None}} or "
                     "the text 'mlp=model,embed='")


def _here(args) -> dict:
    """The command's computing part in this process: its ``--json`` object."""
    from mlsys_jax.cli import user_code
    from mlsys_jax.cli.commands import shard as command
    from mlsys_jax.cli.commands import shard_pipe
    from mlsys_jax.cli.target import factories_on_shapes

    with user_code.time_bound(None), factories_on_shapes(args.abstract):
        mesh = command._mesh_and_layout(args)
        shard_pipe.check_flags(args, mesh)
        if "pipe" in mesh:
            out, _ = shard_pipe.compute(args, mesh)
            out.pop("timeline", None)
            return out
        return command.compute(args, mesh)[0]


def _argv(options: dict) -> list[str]:
    """The command line of ``options`` (the flags not at their default)."""
    argv = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False or value == []:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv
