"""``mlsys-jax run ID|all``: run lecture experiments, print their tables and checked claims.

The running and printing is :func:`experiments.run_and_print`, shared with ``python -m
experiments``; this module adds the options.
"""
from __future__ import annotations

from mlsys_jax.errors import MlsysError

HELP = "run a lecture experiment (01-06) or all of them"


def add_arguments(p) -> None:
    p.add_argument("id", metavar="ID", help="experiment id: 01..06 or 'all'")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting of the experiment's run()")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--report", metavar="DIR", help="write DIR/report.md (+ PNGs with matplotlib)")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="run as N local processes via jax.distributed (experiment 04)")
    p.add_argument("--port", type=int, default=None, metavar="PORT",
                   help="coordinator port on 127.0.0.1 for --processes (default: a free one)")


def parse_sets(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise MlsysError(f"--set expects KEY=VALUE, got {pair!r} (e.g. --set n_layers=100)")
        out[key.strip()] = value.strip()
    return out


def main(args) -> int:
    import experiments  # the experiments import JAX: only once --devices has been applied

    overrides = parse_sets(args.set)
    if args.port is not None and args.processes == 1:
        raise MlsysError("--port is the coordinator's port of a multi-process run; use it with "
                         "--processes N (N >= 2)")
    if args.processes != 1:
        if args.id.lstrip("s0") != "4":
            raise MlsysError("--processes applies to experiment 04 only (multi-process data parallel)")
        return experiments.load("04").launch_processes(args.processes, overrides, args)
    return experiments.run_and_print(args.id, overrides, as_json=args.json, report=args.report)
