"""One package per lecture section; each has run(**overrides) -> Result, check(result) (the
lecture's claims, derived from the result alone) and plots(result, directory) -> PNG paths.
A section is a package ``sNN_<name>/`` whose parts are its modules (``s05_dispatch_fusion/fusion.py``);
``_inputs.py`` holds the host-built inputs that experiments 05 and 06 share.

IDs are the lecture's script numbers (seed 000 §0.3): 01 autodiff & execution models, 02 graph
optimizations, 03 rematerialization, 04 parallelism; 05 dispatch & fusion (seed 003) and
06 frameworks (seed 001). :func:`run_and_print` is the one path that runs and prints them:
``python -m experiments 03``, ``python -m experiments.s03_remat`` and ``mlsys-jax run 03`` all
go through it.
"""
from __future__ import annotations

import importlib
import json
import sys
import time

from mlsys_jax import runtime
from mlsys_jax.errors import MlsysError, run_command

EXPERIMENTS: dict[str, str] = {
    "01": "experiments.s01_autodiff",
    "02": "experiments.s02_graph_opt",
    "03": "experiments.s03_remat",
    "04": "experiments.s04_parallel",
    "05": "experiments.s05_dispatch_fusion",
    "06": "experiments.s06_frameworks",
}


def load(eid: str):
    """Import an experiment module by ID ('02', '2', 's02' or the module's short name)."""
    key = eid.lower().lstrip("s")
    key = key.zfill(2) if key.isdigit() else key
    for k, mod in EXPERIMENTS.items():
        if key in (k, mod.rsplit(".", 1)[1], mod.rsplit(".", 1)[1][4:]):
            return importlib.import_module(mod)
    raise MlsysError(f"unknown experiment {eid!r}; choose one of {', '.join(EXPERIMENTS)} or 'all'")


def run_and_print(eid: str = "all", overrides: dict | None = None, *, as_json: bool = False,
                  report: str | None = None) -> int:
    """Run one experiment (or ``'all'``), print its tables and checked claims, or one JSON object.

    ``overrides`` go to the experiment's ``run()`` (strings are coerced to the settings' types);
    ``report`` is a folder for the markdown report. Returns 1 if a lecture claim fails, else 0.
    """
    overrides = dict(overrides or {})
    if eid == "all" and overrides:
        raise MlsysError("--set applies to one experiment; run it by its ID (e.g. run 03 --set k=8)")
    modules = [load(k) for k in EXPERIMENTS] if eid == "all" else [load(eid)]
    if report:  # checked now, not after minutes of experiments
        runtime.check_output_dir(report, "--report")
    outputs, failed, seconds = [], [], {}
    for module in modules:
        if eid == "all" and not as_json:
            print(f"[{module.ID}] {module.TITLE} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        result = module.run(**overrides)
        checks = list(module.check(result))
        seconds[result.id] = round(time.perf_counter() - t0, 2)
        outputs.append((module, result, checks))
        failed += [f"{result.id}: {c.claim}" for c in checks if not c.ok]
        if not as_json:
            from mlsys_jax.results import format_result

            print(format_result(result, checks), flush=True)
            print(f"({result.id} took {seconds[result.id]:.1f} s)\n", flush=True)
    if eid == "all" and not as_json:
        from mlsys_jax.results import format_summary

        print(format_summary(outputs, seconds), flush=True)
    if report:
        from mlsys_jax.viz.report import write_report

        print(f"report written to {write_report(report, outputs, seconds)}", file=sys.stderr)
    if as_json:
        objs = [r.to_json(c) for _, r, c in outputs]
        print(json.dumps(objs[0] if eid != "all" else {"experiments": objs, "seconds": seconds},
                         indent=1))
    if failed:
        print("FAILED claims:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments [ID|all]``: :func:`run_and_print` on 8 simulated CPU devices.

    ``mlsys-jax run`` is the same path with options (--set, --json, --report, --devices).
    """
    argv = sys.argv[1:] if argv is None else argv

    def command() -> int:
        if len(argv) > 1 or argv and argv[0].startswith("-"):
            raise MlsysError(f"usage: python -m experiments [ID|all] (got {' '.join(argv)}); "
                              "for options use: mlsys-jax run ID --help")
        runtime.configure()
        return run_and_print(argv[0] if argv else "all")

    return run_command(command, prog="experiments")
