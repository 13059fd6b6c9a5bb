"""The Ctrl-C campaign's CI tier (``benchmarks/sigint.py``; issue #39 item 7): each long command —
remat, shard, a pipeline shard, ``inspect --hw here`` — interrupted once at a seeded random moment
of its first seconds ends with exit 130 and the one line ``mlsys-jax: interrupted``, with no
traceback and no core dump. Every command is covered; more moments per command are the by-hand
tier's: the full campaign (10 runs each, moments over the whole run) is
``python -m benchmarks.sigint``."""
import random
import subprocess
import sys

import pytest

from benchmarks import sigint

RUNS = 1  # a run costs the CPU of the command up to its moment, whatever the command's size
HORIZON_S = 8.0  # moments drawn up to here: the import, trace and compile of every command


@pytest.mark.slow
@pytest.mark.parametrize("name", list(sigint.COMMANDS))
def test_ctrl_c_at_random_moments_exits_130_in_one_line(name):
    rng = random.Random(f"sigint-ci-{name}")
    tally = sigint.campaign(name, sigint.COMMANDS[name], runs=RUNS, rng=rng, horizon_s=HORIZON_S)
    assert tally["interrupted"] == RUNS, tally        # these commands outlast the horizon
    assert tally["clean"] == tally["interrupted"], tally["bad"]
    assert tally["crashes"] == 0, tally["bad"]


# a command that returned 0, then Ctrl-C while an exit handler runs (JAX's own run at shutdown)
_CTRL_C_IN_AN_EXIT_HANDLER = """
import atexit, os, signal, sys, time
from mlsys_jax.cli import user_code
signal.signal(signal.SIGINT, signal.default_int_handler)
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))
print("result")
raise SystemExit(user_code.exit_status(0))
"""


def test_ctrl_c_while_the_interpreter_shuts_down_is_130_in_one_line():
    out = subprocess.run([sys.executable, "-c", _CTRL_C_IN_AN_EXIT_HANDLER], cwd=sigint.ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (130, "result\n", "mlsys-jax: interrupted\n")


# Ctrl-C while `mlsys-jax` imports its own code, before main() runs (a moment the campaign found
# on a loaded machine: the import took 0.7 s); argv[0] as the command has it, or Python code's
_CTRL_C_WHILE_STARTING = """
import builtins, runpy, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.argv = [sys.argv[1], "inspect"]
real = builtins.__import__
def interrupted(name, *args, **kwargs):
    if name == "mlsys_jax.cli.main":
        raise KeyboardInterrupt  # the signal's handler, at this moment of the import
    return real(name, *args, **kwargs)
builtins.__import__ = interrupted
runpy.run_module("mlsys_jax.cli", run_name="__main__")
"""


@pytest.mark.parametrize("argv0, status, stderr", [
    ("mlsys-jax", 130, "mlsys-jax: interrupted\n"),   # the console script
    ("-m", 130, "mlsys-jax: interrupted\n"),          # python -m mlsys_jax.cli
    ("notebook.py", -2, "KeyboardInterrupt\n"),       # imported by Python code: its own
])
def test_ctrl_c_while_the_command_starts(argv0, status, stderr):
    out = subprocess.run([sys.executable, "-c", _CTRL_C_WHILE_STARTING, argv0], cwd=sigint.ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == status, out.stderr
    assert out.stderr == stderr if status == 130 else out.stderr.endswith(stderr)
