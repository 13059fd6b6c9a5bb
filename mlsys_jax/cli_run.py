"""``mlsys-jax run ID|all``: run lecture experiments, print their tables and checked claims."""
from __future__ import annotations

import json
import sys
import time

import experiments
from mlsys_jax.errors import MlsysError
from mlsys_jax.report import format_result


def parse_sets(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise MlsysError(f"--set expects KEY=VALUE, got {pair!r} (e.g. --set n_layers=100)")
        out[key.strip()] = value.strip()
    return out


def run_one(module, overrides: dict) -> tuple:
    """Run one experiment module; returns (result, checks, seconds)."""
    t0 = time.perf_counter()
    result = module.run(**overrides)
    checks = list(module.check(result))
    return result, checks, time.perf_counter() - t0


def main(args) -> int:
    overrides = parse_sets(args.set)
    if args.processes != 1:
        if args.id.lstrip("s0") != "4":
            raise MlsysError("--processes applies to experiment 04 only (multi-process data parallel)")
        return experiments.load("04").launch_processes(args.processes, overrides, args)
    if args.id == "all":
        if overrides:
            raise MlsysError("--set applies to one experiment; run it by its ID (e.g. run 03 --set k=8)")
        ids = list(experiments.EXPERIMENTS)
    else:
        experiments.load(args.id)  # validates the ID with a clear message
        ids = [args.id]
    outputs, failed, split = [], [], {}
    for eid in ids:
        module = experiments.load(eid)
        if args.id == "all" and not args.json:
            print(f"[{module.ID}] {module.TITLE} ...", file=sys.stderr, flush=True)
        result, checks, seconds = run_one(module, overrides)
        split[result.id] = round(seconds, 2)
        outputs.append((module, result, checks))
        failed += [f"{result.id}: {c.claim}" for c in checks if not c.ok]
        if not args.json:
            print(format_result(result, checks), flush=True)
            print(f"({result.id} took {seconds:.1f} s)\n", flush=True)
    if args.report:
        from mlsys_jax.viz.report import write_report

        path = write_report(args.report, outputs, split)
        print(f"report written to {path}", file=sys.stderr)
    if args.json:
        objs = [r.to_json(c) for _, r, c in outputs]
        print(json.dumps(objs[0] if len(objs) == 1 and args.id != "all" else
                         {"experiments": objs, "seconds": split}, indent=1))
    if failed:
        print("FAILED claims:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0
