"""docs/cli.md is what the parsers say now, the same on every machine and terminal."""
from pathlib import Path

import benchmarks
from mlsys_jax.cli import reference
from mlsys_jax.cli.main import COMMANDS, build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_docs_cli_md_is_current():
    want, have = reference.render(), DOC.read_text(encoding="utf-8")
    if have != want:
        diff = next((f"line {i + 1}: docs/cli.md has {a!r}, the parsers give {b!r}"
                     for i, (a, b) in enumerate(zip(have.splitlines(), want.splitlines()))
                     if a != b), "the files differ in length")
        raise AssertionError(f"docs/cli.md is out of date ({diff}); regenerate it with "
                             f"`{reference.COMMAND}`")


def test_reference_has_every_command_and_option():
    text = reference.render()
    parser = build_parser(width=reference.WIDTH)
    for name in COMMANDS:
        section = text.split(f"\n## mlsys-jax {name}\n")[1].split("\n## ")[0]
        assert f"usage: mlsys-jax {name} " in section
        for action in parser.commands[name]._actions:
            for option in action.option_strings:
                assert option in section, f"{name} {option}"


def test_reference_ignores_the_terminal_and_this_machines_runs(monkeypatch, tmp_path):
    first = reference.render()
    monkeypatch.setenv("COLUMNS", "45")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    benchmarks.record_run("dispatch", quick=True, seconds=3.0)
    assert reference.render() == first
