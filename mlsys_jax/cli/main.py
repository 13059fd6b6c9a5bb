"""The ``mlsys-jax`` command line: the parser, the dispatch to one module per command, and the
one place where a user error becomes a one-line message (:func:`mlsys_jax.errors.run_command`).

    mlsys-jax [--devices N] COMMAND ...     (mlsys-jax COMMAND --help for each command)

A command is a module ``mlsys_jax/cli/commands/<name>.py`` with ``HELP`` (one line), ``add_arguments(p)``
and ``main(args) -> exit status``, listed in :data:`COMMANDS`, and optionally ``listing(width, *,
here)``: text printed after its ``--help`` (``bench`` lists its benchmarks). Command modules import
JAX only inside ``main``: JAX must start after ``--devices`` has set the simulated CPU device count,
and so the parser is built, and ``--help`` printed, without starting JAX (tests/cli/test_help.py).
:func:`build_parser` with a fixed ``width`` is also the source of docs/cli.md
(:mod:`mlsys_jax.cli.reference`).
Every usage error — argparse's own included — prints ``mlsys-jax: error: ...`` and one ``usage:``
hint line, and exits 2; the environment is checked before JAX is imported (``runtime``). A failed
experiment check exits 1. Commands on a user's ``FILE.py:FN`` (those with a ``target`` argument)
get ``--import-timeout`` and run the user's code under JAX's defaults (float32 unless ``--x64``).
"""
from __future__ import annotations

import argparse
import functools
import importlib
import math
import sys

from mlsys_jax.errors import UsageError, run_command

COMMANDS = (
    "run",
    "inspect",
    "optimize",
    "bench",
    "fuzz",
    "remat",
    "shard",
    "plan",
)


class OneLineParser(argparse.ArgumentParser):
    """argparse with the tool's error format: ``error()`` raises :class:`UsageError` (one line,
    then one ``usage:`` hint) instead of printing the usage block and exiting."""

    commands: dict = {}  # the top-level parser's: command name -> its parser
    listing = None  # a command's listing(width) -> text printed after its help, read when printed

    def format_help(self) -> str:
        text = super().format_help()
        if self.listing is None:
            return text
        width = self._get_formatter()._width  # the help's own width: COLUMNS, or the fixed one
        return f"{text}\n{self.listing(width)}\n"

    def parse_args(self, args=None, namespace=None):
        # argparse reports leftover arguments from the top-level parser; name their command
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            where = self.commands.get(getattr(parsed, "command", None), self)
            where.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def error(self, message):
        command = self.prog.removeprefix("mlsys-jax").strip()
        positionals = " ".join(a.metavar or a.dest.upper() for a in self._actions
                               if not a.option_strings and a.dest != "command")
        if not command:
            positionals = "COMMAND"
        shown = " ".join(p for p in (self.prog, positionals, "[options]") if p)
        raise UsageError(f"{command + ': ' if command else ''}{message}",
                         f"usage: {shown} ({self.prog} --help lists them)")


def command_module(name: str):
    return importlib.import_module(f"mlsys_jax.cli.commands.{name}")


def seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds (nan and inf are refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number of seconds, got "
                                         f"{text!r}")
    return value


def build_parser(*, width: int | None = None, here: bool = True) -> argparse.ArgumentParser:
    """The whole command line; it imports no JAX (the command modules import it in ``main``).

    ``width`` fixes the help's columns (default: the terminal's, as argparse reads ``COLUMNS``), so
    the reference (docs/cli.md) is the same everywhere; ``here=False`` leaves out of the listings
    what only this machine knows (bench's last run times), for the same reason."""
    from mlsys_jax.cli.user_code import DEFAULT_IMPORT_TIMEOUT_S
    from mlsys_jax.runtime import DEFAULT_DEVICES

    formatter = argparse.HelpFormatter
    if width is not None:
        formatter = functools.partial(argparse.HelpFormatter, width=width)
    p = OneLineParser(prog="mlsys-jax", formatter_class=formatter,
                      description="See, measure and change how a deep-learning system works, in "
                                  "real JAX code.")
    p.add_argument("--devices", type=int, default=None, metavar="N",
                   help=f"simulated CPU device count, set before JAX starts (default "
                        f"{DEFAULT_DEVICES})")
    p.add_argument("--version", action="store_true",
                   help="print mlsys-jax's version and exit (alone: JAX is not started)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p.commands = {}
    for name in COMMANDS:
        module = command_module(name)
        q = p.commands[name] = sub.add_parser(name, help=module.HELP, description=module.HELP,
                                              formatter_class=formatter)
        module.add_arguments(q)
        if hasattr(module, "listing"):
            q.listing = functools.partial(module.listing, here=here)
        q.add_argument("--devices", type=int, default=None, dest="devices_sub", metavar="N",
                       help=f"simulated CPU device count (default {DEFAULT_DEVICES})")
        if any(a.dest == "target" for a in q._actions):
            q.add_argument("--import-timeout", type=seconds, default=DEFAULT_IMPORT_TIMEOUT_S,
                           metavar="SECONDS", dest="import_timeout",
                           help="bound on importing FILE.py and calling its factory (default "
                                f"{DEFAULT_IMPORT_TIMEOUT_S:g})")
            q.add_argument("--abstract", action="store_true",
                           help="run the factory on shapes (jax.eval_shape): its arrays become "
                                "ShapeDtypeStructs and nothing of the model is allocated")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command line (``argv``, or this process's own when None) and return its exit
    status. As the process's own command line, it also reports a thread that fails in one line
    and ends threads the user's code left running (:mod:`mlsys_jax.cli.user_code`)."""
    from mlsys_jax.cli import user_code

    if (sys.argv[1:] if argv is None else list(argv)) == ["--version"]:
        from mlsys_jax import __version__

        print(f"mlsys-jax {__version__}")       # without starting JAX
        return 0
    if argv is None:
        user_code.report_thread_failures_in_one_line()

    def command() -> int:
        from mlsys_jax import runtime

        runtime.check_environment()
        args = build_parser().parse_args(argv)  # JAX is not imported yet: --help stays fast
        if args.version:
            from mlsys_jax import __version__

            print(f"mlsys-jax {__version__}")
            return 0
        if args.devices_sub is not None:
            args.devices = args.devices_sub
        devices = runtime.DEFAULT_DEVICES if args.devices is None else args.devices
        runtime.configure(devices=devices, x64=False)
        runtime.start_backend()
        from mlsys_jax.cli.target import factories_on_shapes

        with user_code.time_bound(getattr(args, "import_timeout", None)), \
                factories_on_shapes(getattr(args, "abstract", False)):
            if not hasattr(args, "x64"):
                return command_module(args.command).main(args)
            with runtime.user_precision(args.x64):
                return command_module(args.command).main(args)

    status = run_command(command)
    return user_code.exit_status(status) if argv is None else status
