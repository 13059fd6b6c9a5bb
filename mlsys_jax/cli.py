"""The ``mlsys-jax`` command line.

    mlsys-jax run ID|all [--set KEY=VALUE ...] [--json] [--devices N] [--report DIR]
    mlsys-jax inspect FILE.py:FN --arg SPEC [...] [--grad] [--hw NAME] [--dtype DT] [--fused] [--json] [--dot OUT]
    mlsys-jax optimize FILE.py:FN --arg SPEC [...] [--passes LIST] [--search] [--alpha A] [--json]
    mlsys-jax bench [NAME ...] [--json]
    mlsys-jax fuzz [--programs N] [--seed S] [--passes LIST] [--time-budget S] [--mutants] [--json]
    mlsys-jax shard FILE.py:FN --mesh data=N[,model=M] [--zero 0-3] [--steps S] [--processes P] [--json]

JAX is imported only after ``--devices`` has set the simulated CPU device count. A user error
prints one line ``mlsys-jax: error: ...`` and exits 2; a failed experiment check exits 1.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from mlsys_jax.errors import MlsysError

# subcommand -> (module, function); each handler takes the parsed args and returns an exit code.
HANDLERS = {
    "run": ("mlsys_jax.cli_run", "main"),
    "inspect": ("mlsys_jax.cli_inspect", "inspect_main"),
    "optimize": ("mlsys_jax.passes.cli", "optimize_main"),
    "bench": ("benchmarks.runner", "main"),
    "fuzz": ("mlsys_jax.fuzz.cli", "main"),
    "shard": ("mlsys_jax.cli_shard", "main"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlsys-jax", description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=None,
                   help="simulated CPU device count, set before JAX starts (default 8)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a lecture experiment (01-06) or all of them")
    run.add_argument("id", help="experiment id: 01..06 or 'all'")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override a setting of the experiment's run()")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.add_argument("--report", metavar="DIR", help="write DIR/report.md (+ PNGs with matplotlib)")
    run.add_argument("--processes", type=int, default=1,
                     help="run as N local processes via jax.distributed (experiment 04)")
    run.add_argument("--devices", type=int, default=None, dest="devices_sub",
                     help="simulated CPU device count (default 8)")

    for name in ("inspect", "optimize"):
        q = sub.add_parser(name, help=("cost table of a function's jaxpr" if name == "inspect"
                                       else "apply verified rewrite passes to a function"))
        q.add_argument("target", metavar="FILE.py:FN")
        q.add_argument("--arg", action="append", default=[], metavar="SPEC",
                       help="argument shape spec like f32[32,784] (one per positional argument)")
        q.add_argument("--hw", default="h100", help="hardware model: h100, h200, a100, cpu")
        q.add_argument("--dtype", default=None, help="cost every float tensor as this dtype (e.g. bf16)")
        q.add_argument("--json", action="store_true", help="print one JSON object")
        q.add_argument("--devices", type=int, default=None, dest="devices_sub")
        if name == "inspect":
            q.add_argument("--grad", action="store_true",
                           help="inspect the gradient of the summed first output w.r.t. the first argument")
            q.add_argument("--fused", action="store_true", help="group kernels with the fusion model")
            q.add_argument("--dot", metavar="OUT.dot", help="write a Graphviz DOT file")
        else:
            q.add_argument("--passes", default=None,
                           help="comma-separated passes (default: the standard pipeline)")
            q.add_argument("--search", action="store_true", help="cost-based search over rewrites")
            q.add_argument("--alpha", type=float, default=1.05, help="search slack (default 1.05)")

    bench = sub.add_parser("bench", help="run benchmarks side by side, report ratios")
    bench.add_argument("names", nargs="*", help="benchmark names (default: all)")
    bench.add_argument("--json", action="store_true")
    bench.add_argument("--quick", action="store_true", help="small sizes (the CI tier)")
    bench.add_argument("--md", metavar="FILE", help="also write the figures as markdown (BENCHMARKS.md)")
    bench.add_argument("--devices", type=int, default=None, dest="devices_sub")

    fuzz = sub.add_parser("fuzz", help="differential testing of passes on random programs")
    fuzz.add_argument("--programs", type=int, default=300)
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--passes", default=None)
    fuzz.add_argument("--time-budget", type=float, default=None, dest="time_budget")
    fuzz.add_argument("--mutants", action="store_true", help="run the mutation-score campaign")
    fuzz.add_argument("--json", action="store_true")
    fuzz.add_argument("--out", default=None, help="folder for reproducers of failures")
    fuzz.add_argument("--devices", type=int, default=None, dest="devices_sub")

    from mlsys_jax.cli_shard import add_parser as add_shard_parser

    add_shard_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    devices = args.devices_sub if getattr(args, "devices_sub", None) is not None else args.devices
    args.devices = devices
    debug = bool(os.environ.get("MLSYS_JAX_DEBUG"))
    try:
        from mlsys_jax import runtime

        runtime.configure(devices=devices or runtime.DEFAULT_DEVICES, x64=True)
        module, func = HANDLERS[args.command]
        try:
            handler = getattr(importlib.import_module(module), func)
        except ModuleNotFoundError as e:
            if e.name and module.startswith(e.name):
                raise MlsysError(f"'{args.command}' is not available in this checkout yet") from None
            raise
        return int(handler(args) or 0)
    except (MlsysError, LookupError, FileNotFoundError) as e:
        if debug:
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"mlsys-jax: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
