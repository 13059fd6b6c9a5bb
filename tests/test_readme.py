"""The README's commands, read from the README and run as a new user would: the second command
is what CI runs, the first runs the lecture, and every Quickstart command succeeds on a fresh
clone; the annotated output under "Reading the output" is what `inspect` prints today."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _block(after: str, lang: str = "bash") -> list[str]:
    """The lines of the first ``lang`` code block after the heading ``after``."""
    text = README[README.index(after):] if after else README
    body = re.search(rf"```{lang}\n(.*?)```", text, re.S).group(1)
    return [line for line in body.splitlines() if line.strip()]


def _mlsys_jax(line: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run one README line that starts with ``mlsys-jax`` with this venv's entry point, in
    ``cwd`` (where the line's relative paths, ``examples/`` and outputs, resolve)."""
    words = shlex.split(line)
    assert words[0] == "mlsys-jax", line
    exe = Path(sys.executable).parent / "mlsys-jax"
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([str(exe), *words[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture
def clone(tmp_path):
    """A working directory like a fresh clone's root: examples/ reachable, nothing else."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def test_the_second_command_is_the_one_ci_runs():
    first, second = _block("")[:2]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert second in ci, "the README's test command and .ci/run's must stay identical"
    assert first.endswith("&& mlsys-jax run all") and first.split(" && ")[:2] == \
        second.split(" && ")[:2]


def test_the_quickstart_has_five_commands_on_shipped_examples():
    commands = _block("## Quickstart")
    assert len(commands) == 5
    for line in commands:
        target = shlex.split(line)[2]
        path, fn = target.split(":")
        assert re.search(rf"^def {fn}\(", (ROOT / path).read_text(), re.M), line


@pytest.mark.slow
def test_the_first_command_runs_the_lecture(clone):
    line = _block("")[0].split(" && ")[-1]
    done = _mlsys_jax(line, clone, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "== summary: 6 experiments" in done.stdout and "0 ✗ failed" in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("k", range(5))
def test_every_quickstart_command_runs(clone, k):
    line = _block("## Quickstart")[k]
    done = _mlsys_jax(line, clone, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout.splitlines()
    assert out and sum(len(x) <= 80 for x in out) >= 0.95 * len(out)  # COLUMNS=80
    if " --emit " in line:
        assert (clone / shlex.split(line.split(" --emit ")[1])[0]).exists()
    if line.split()[1] in ("inspect", "optimize"):   # a screenful, whatever the model's size
        assert len(out) <= 60, len(out)
    if line.split()[1] == "optimize":
        assert any(x.startswith("verified: yes") for x in out)
        assert sum(x.strip().startswith("fold_constants") for x in out) == 1  # grouped rows
    if line.split()[1] == "inspect":
        _reading_the_output_is_current(done.stdout)


def _reading_the_output_is_current(printed: str) -> None:
    """Every line of the README's annotated example but the abridgement is in today's output
    (XLA's row only by its first figure: its temp bytes depend on the CPU XLA compiles for)."""
    shown = README[README.index("## Reading the output"):]
    shown = re.search(r"```\n(.*?)```", shown, re.S).group(1).splitlines()
    for line in shown:
        if line.strip() == "...":
            continue
        if line.strip().startswith("XLA "):
            line = line[:line.index("|", line.index("|") + 1)]
        assert line in printed, f"README's 'Reading the output' is out of date: {line!r}"
