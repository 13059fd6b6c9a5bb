"""``--help`` starts no JAX, lists every command, shows no internal names, and ``bench --help``
lists the benchmarks with the times they last took here (recorded, never typed in)."""
import argparse
import json
import subprocess
import sys
import types

import pytest

import benchmarks
from mlsys_jax.cli.commands import bench
from mlsys_jax.cli.main import COMMANDS, build_parser, command_module


def jax_modules(importtime: str) -> list[str]:
    """Modules named in ``python -X importtime``'s report whose top package starts with 'jax'."""
    names = [line.rsplit("|", 1)[1].strip() for line in importtime.splitlines()
             if line.startswith("import time:") and line.count("|") == 2]
    assert "mlsys_jax.cli.main" in names, importtime[-2000:]  # the report was read
    return [n for n in names if n.split(".")[0].startswith("jax")]


@pytest.mark.parametrize("argv", [["--help"], ["shard", "--help"], ["bench", "--help"]])
def test_help_imports_no_jax(argv):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mlsys_jax.cli", *argv],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert jax_modules(done.stderr) == []
    assert done.stdout.startswith(f"usage: mlsys-jax{' ' + argv[0] if len(argv) > 1 else ''} ")


def test_every_commands_help_imports_no_jax():
    """Every command's help, formatted in one fresh process (bench's listing included)."""
    code = ("import sys; from mlsys_jax.cli.main import build_parser; p = build_parser(); "
            "p.format_help(); [q.format_help() for q in p.commands.values()]; "
            "print(sorted(m for m in sys.modules if m.split('.')[0].startswith('jax')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_top_level_help_lists_every_command():
    text = build_parser(width=200).format_help()
    for name in COMMANDS:
        assert f"    {name}{' ' * (11 - len(name))}{command_module(name).HELP}\n" in text


def value_options(parser):
    return [a for a in parser._actions if a.option_strings and a.nargs != 0]


def test_no_internal_dest_names_in_help():
    """An option's value is named by its metavar (or its choices), else argparse shows its dest
    upper-cased: allowed only where the dest is the option's own name (``--hw HW``)."""
    parser = build_parser(width=100)
    leaks = []
    for name, q in [("", parser), *parser.commands.items()]:
        for a in value_options(q):
            own = max(a.option_strings, key=len).lstrip("-")
            if a.metavar is None and a.choices is None and (a.dest != own or "_" in a.dest):
                leaks.append(f"{name} {own} shows {a.dest.upper()}")
        text = q.format_help()
        assert "DEVICES_SUB" not in text and "--devices N" in text
    assert leaks == []


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder for the benchmarks' run times."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "mlsys-jax"


def rows(listing: str) -> dict[str, str]:
    """The listing's table: benchmark name -> the rest of its first line."""
    return {line.split("|")[0].strip(): line.split("|", 1)[1] for line in listing.splitlines()
            if line.startswith("  ") and "|" in line and line.split("|")[0].strip()}


def test_bench_help_lists_benchmarks_not_yet_run(cache):
    listing = build_parser(width=120).commands["bench"].format_help()
    table = rows(listing.split("\nbenchmarks:\n")[1])
    assert list(table) == ["NAME", *benchmarks.discover()]
    assert all(cells.split("|")[0].strip() == "not yet" for n, cells in table.items()
               if n != "NAME")
    assert "Rematerialization" in table["remat"]  # its docstring's first sentence


def test_bench_help_shows_the_last_recorded_times(cache):
    benchmarks.record_run("dispatch", quick=False, seconds=42.4)
    benchmarks.record_run("dispatch", quick=True, seconds=2.26)
    benchmarks.record_run("passes", quick=True, seconds=700)
    table = rows(bench.listing(120))
    assert table["dispatch"].split("|")[0].strip() == "42 s, --quick 2.3 s"
    assert table["passes"].split("|")[0].strip() == "--quick 12 min"
    assert table["plan"].split("|")[0].strip() == "not yet"
    assert "last run here" not in bench.listing(120, here=False)  # the reference's


def test_unreadable_times_are_none_and_rewritten(cache):
    cache.mkdir(parents=True)
    (cache / benchmarks.TIMES_FILE).write_text("{not json")
    assert benchmarks.last_runs() == {}
    benchmarks.record_run("plan", quick=True, seconds=1.5)
    assert benchmarks.last_runs() == {"plan": {"quick": 1.5}}
    assert json.loads((cache / benchmarks.TIMES_FILE).read_text())  # whole JSON again


def test_the_runner_records_each_benchmark(cache, monkeypatch, capsys):
    from benchmarks import runner

    fake = types.ModuleType("fake_bench")
    fake.run = lambda quick=False: {"figures": {"x": 1.0}, "notes": []}
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setattr(runner, "discover", lambda: {"fake": "fake_bench"})
    args = argparse.Namespace(names=[], quick=True, json=True, md=None)
    assert runner.main(args) == 0
    seconds = json.loads(capsys.readouterr().out)["benchmarks"]["fake"]["seconds"]
    assert benchmarks.last_runs() == {"fake": {"quick": seconds}}


def test_times_live_in_the_tools_cache_folder(cache):
    from mlsys_jax.cost.cache import cache_dir

    assert benchmarks.cache_dir() == cache_dir() == cache
