"""The command-line reference, docs/cli.md, generated from the parsers themselves::

    python -m mlsys_jax.cli.reference > docs/cli.md

Every command's ``--help`` (usage line, every option with its help) as :func:`build_parser` makes
it, so the reference cannot drift from the code: tests/cli/test_reference.py compares docs/cli.md
with :func:`render`. The help is laid out at a fixed :data:`WIDTH` (argparse would read the
terminal's ``COLUMNS``) and without what only this machine knows (bench's last run times), so the
file is the same wherever it is generated. Building the parsers imports no JAX.
"""
from __future__ import annotations

import sys

from mlsys_jax.cli.main import COMMANDS, build_parser, command_module

WIDTH = 100  # columns of the help text in the reference
COMMAND = "python -m mlsys_jax.cli.reference > docs/cli.md"


def render() -> str:
    """docs/cli.md: an index of the commands, then ``mlsys-jax --help`` and each command's."""
    parser = build_parser(width=WIDTH, here=False)
    out = ["# Command-line reference", "",
           f"Generated from the argparse parsers by `{COMMAND}`; do not edit it by hand "
           "(tests/cli/test_reference.py fails when it differs from the parsers). "
           "`mlsys-jax COMMAND --help` prints the same text, at your terminal's width.", "",
           "| command | what it does |", "|---|---|"]
    out += [f"| [`{name}`](#mlsys-jax-{name}) | {command_module(name).HELP} |"
            for name in COMMANDS]
    out += ["", "## mlsys-jax", "", *_block(parser.format_help())]
    for name in COMMANDS:
        out += ["", f"## mlsys-jax {name}", "", *_block(parser.commands[name].format_help())]
    return "\n".join(out) + "\n"


def _block(text: str) -> list[str]:
    """Help text as a fenced block, trailing spaces and blank lines removed."""
    lines = [line.rstrip() for line in text.rstrip().splitlines()]
    return ["```text", *lines, "```"]


def main() -> int:
    sys.stdout.reconfigure(encoding="utf-8")  # the help holds §, × and µ, whatever the locale
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
