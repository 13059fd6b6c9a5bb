"""Experiment 04: data, tensor and pipeline parallelism, ZeRO and 3D with jax.shard_map (§5, §7.3-7.4).

Every layout runs as a real SPMD program over simulated CPU devices (the lecture's "GPUs"); the same
code runs unchanged on a multi-device or multi-host mesh. Each parallel step is compared with the
single-device step (loss, gradients, updated parameters), and each collective is read from the
compiled HLO. The sections live beside this module: ``_s04_data`` (demo 1, ZeRO),
``_s04_tensor`` (demo 2), ``_s04_pipeline`` (demo 3) and ``_s04_threed`` (3D).
"""
from __future__ import annotations

import json
import os

import jax
import numpy as np

from experiments.s04_parallel.compare import TOL
from experiments.s04_parallel.data import data_checks, data_section
from experiments.s04_parallel.pipeline import pipeline_checks, pipeline_section, schedule_grids
from experiments.s04_parallel.tensor import tensor_checks, tensor_section
from experiments.s04_parallel.threed import threed_checks, threed_section
from mlsys_jax import runtime
from mlsys_jax.errors import MlsysError
from mlsys_jax.results import (Check, Result, check_settings, format_result,
                              resolve_overrides)
from mlsys_jax.viz import plots as viz

ID = "04"
TITLE = "Parallelism: data, tensor, pipeline, ZeRO and 3D on a device mesh (§5, §7.3)"
DEFAULTS = {"batch": 32, "dp_devices": 4, "uneven": (10, 10, 10, 2), "sizes": (16, 32, 4),
            "tp_devices": 4, "tokens": 8, "d_model": 8, "d_hidden": 16, "lr": 0.05,
            "pp_stages": 2, "microbatches": 4, "seed": 0,
            "sections": ("data", "tensor", "pipeline", "3d")}
SECTIONS = ("data", "tensor", "pipeline", "3d")
COMM_TABLE = "communication per step (HLO vs ring formula)"


def run(**overrides) -> Result:
    """Run demos 1-3, ZeRO, 3D and the communication table; layouts that don't fit are skipped."""
    runtime.enable_x64()
    cfg = _validated(overrides)
    tables, notes, data = {}, [], {"config": cfg}
    comm_rows = []
    for name, label, section in (("data", "data parallel and ZeRO", data_section),
                                 ("tensor", "tensor parallel", tensor_section)):
        if name in cfg["sections"]:
            got = _or_skip(label, section, cfg, notes)
            comm_rows += got.pop("_comm", [])
            tables.update(got)
    if "pipeline" in cfg["sections"]:
        tables.update(pipeline_section(cfg["pp_stages"], cfg["microbatches"], jax.devices()))
        data["schedule_grids"] = schedule_grids(4, 8)  # §5.3's in-flight example, for plots()
    if "3d" in cfg["sections"]:
        tables.update(threed_section(jax.devices()))
    if comm_rows:
        tables[COMM_TABLE] = comm_rows
        notes.append("ZeRO-1 here all-reduces the gradient (every device keeps the full averaged "
                     "gradient, the Ψ of its formula), so it sends 1.5x DP; ZeRO-2 reduce-scatters "
                     "instead and is back to DP's volume. ZeRO-3 all-gathers the parameters once "
                     "and keeps them for the backward (temp memory), so it also sends what DP "
                     "does, not the paper's 1.5x (which re-gathers in the backward). PP's "
                     "bytes per step: `mlsys-jax bench parallel`.")
    notes.append(f"{jax.device_count()} {jax.devices()[0].platform.upper()} devices; float64; "
                 "collective bytes = per-device bytes sent by a ring algorithm")
    return Result(ID, TITLE, tables, notes, data)


def _validated(overrides: dict) -> dict:
    """The settings, every one checked before work starts."""
    cfg = resolve_overrides(ID, DEFAULTS, overrides)
    unknown = sorted(set(cfg["sections"]) - set(SECTIONS))
    if unknown:
        raise MlsysError(f"experiment 04: unknown section(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(SECTIONS)} (e.g. --set sections=data,pipeline)")
    positive = ("batch", "dp_devices", "sizes", "tp_devices", "tokens", "d_model", "d_hidden",
                "pp_stages", "microbatches")
    check_settings(ID, cfg, DEFAULTS, minimum={**dict.fromkeys(positive, 1), "uneven": 0,
                                               "seed": 0},
                   maximum={"seed": (2**32 - 1, "a 32-bit seed")},
                   lengths={"sizes": (2, None)})  # input width, (hidden widths,) classes
    sizes = cfg["sizes"]
    # every simulated device holds the parameters and its slice: ×8 devices, ×16 copies (Adam,
    # gradients, activations, the single-device reference)
    values = (cfg["batch"] * sum(sizes) + sum(a * b for a, b in zip(sizes, sizes[1:]))
              + cfg["tokens"] * (cfg["d_model"] + cfg["d_hidden"]) + cfg["d_model"] * cfg["d_hidden"])
    runtime.check_memory(8 * 16 * 8 * values, f"experiment 04 with batch={cfg['batch']}, sizes="
                         f"{','.join(map(str, sizes))}, tokens={cfg['tokens']}",
                         "lower batch, sizes, tokens, d_model or d_hidden")
    return cfg


def _or_skip(label, section, cfg, notes) -> dict:
    try:
        return section(cfg)
    except MlsysError as e:  # a layout that does not fit the devices: say so, don't crash
        if "make_mesh" not in str(e):
            raise
        notes.append(f"{label} skipped: {e}")
        return {}


def check(result: Result) -> list[Check]:
    """The lecture's claims, tested on the computed tables (plus the communication table)."""
    t, cfg = result.tables, result.data["config"]
    checks = (data_checks(t, cfg["dp_devices"]) + tensor_checks(t)
              + pipeline_checks(t, (cfg["pp_stages"], cfg["microbatches"])) + threed_checks(t))
    if t.get(COMM_TABLE):
        bad = [r["layout"] for r in t[COMM_TABLE] if not r["match"]]
        checks.append(Check("collective bytes in compiled HLO == ring formulas for every layout",
                            not bad, bad or "all match", "formula"))
    return checks


def plots(result: Result, directory: str) -> list[str]:
    """GPipe and 1F1B as timelines (§5.3), a PNG in ``directory`` drawn from ``result``; returns
    its path ([] without matplotlib, or when the pipeline section did not run)."""
    grids = result.data.get("schedule_grids")
    if not grids:
        return []
    path = viz.schedule_grid(os.path.join(directory, "04_pipeline_timeline.png"), grids,
                             title="Pipeline schedules as data (§5.3)")
    return [path] if path else []


def launch_processes(n: int, overrides: dict, args) -> int:
    """``mlsys-jax run 04 --processes N``: the DP step as N processes, compared with one process.

    Both sides run in float64, as every section of this experiment does (the workers enable it
    for themselves); ``args.json`` prints one JSON object instead of the table."""
    from mlsys_jax.parallel import multiprocess

    runtime.enable_x64()
    total = jax.device_count()
    if n < 2 or total % n:
        raise MlsysError(f"--processes {n}: the {total} devices (--devices) must split evenly into "
                         f">= 2 processes, e.g. --processes 2 --devices {2 * max(total // 2, 1)}")
    settings = {k: v for k, v in _validated(overrides).items() if k in multiprocess.SETTINGS}
    settings = {**multiprocess.SETTINGS, **settings}
    many = multiprocess.launch(n, total // n, settings, port=getattr(args, "port", None))
    one = multiprocess.run_dp_demo(**settings)
    diff = lambda k: float(np.max(np.abs(np.asarray(many[k]) - np.asarray(one[k]))))
    row = {"layout": f"{n} processes × {total // n} CPU devices (gloo)", "devices": many["devices"],
           "loss_diff": diff("losses"), "grad_diff": diff("grads"), "param_diff": diff("params"),
           "ranks_agree": many["ranks_agree"]}
    worst = max(row["loss_diff"], row["grad_diff"], row["param_diff"])
    result = Result(ID, TITLE + " — multi-process", {"multi-process DP vs one process": [row]},
                    [f"{settings['steps']} Adam steps, batch {settings['batch']}, float64, "
                     "coordinator on 127.0.0.1"])
    checks = [Check(f"{n}-process DP == 1-process DP (loss, grads, params)",
                    worst < TOL and many["ranks_agree"], worst, f"< {TOL}")]
    if getattr(args, "json", False):
        print(json.dumps(result.to_json(checks), indent=1), flush=True)
    else:
        print(format_result(result, checks), flush=True)
    return 0 if all(c.ok for c in checks) else 1
