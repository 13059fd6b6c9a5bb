"""The ``mlsys-jax`` command line: the parser, the dispatch to one module per command, and the
one place where a user error becomes a one-line message (:func:`mlsys_jax.errors.run_command`).

    mlsys-jax [--devices N] COMMAND ...     (mlsys-jax COMMAND --help for each command)

A command is a module ``mlsys_jax/cli/<name>.py`` with ``HELP`` (one line), ``add_arguments(p)``
and ``main(args) -> exit status``, listed in :data:`COMMANDS`. Command modules import JAX only
inside ``main``: JAX must start after ``--devices`` has set the simulated CPU device count.
A user error prints ``mlsys-jax: error: ...`` and exits 2; a failed experiment check exits 1.
Commands on a user's function (those with ``--x64``, from :mod:`mlsys_jax.cli.target`) run it
under JAX's defaults (float32 unless ``--x64``); the others enable float64 where they need it.
"""
from __future__ import annotations

import argparse
import importlib

from mlsys_jax.errors import run_command

COMMANDS = (
    "run",
    "inspect",
    "optimize",
    "bench",
    "fuzz",
    "remat",
    "shard",
)


def command_module(name: str):
    return importlib.import_module(f"mlsys_jax.cli.{name}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlsys-jax",
                                description="See, measure and change how a deep-learning system "
                                            "works, in real JAX code.")
    p.add_argument("--devices", type=int, default=None,
                   help="simulated CPU device count, set before JAX starts (default 8)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = command_module(name)
        q = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(q)
        q.add_argument("--devices", type=int, default=None, dest="devices_sub",
                       help="simulated CPU device count (default 8)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.devices_sub is not None:
        args.devices = args.devices_sub

    def command() -> int:
        from mlsys_jax import runtime

        devices = runtime.DEFAULT_DEVICES if args.devices is None else args.devices
        runtime.configure(devices=devices, x64=False)
        if not hasattr(args, "x64"):
            return command_module(args.command).main(args)
        with runtime.user_precision(args.x64):
            return command_module(args.command).main(args)

    return run_command(command)
