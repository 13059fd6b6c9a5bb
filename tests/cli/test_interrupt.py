"""Ctrl-C ends a command with one line and exit 130: while XLA compiles on its own threads too
(the interpreter's shutdown used to abort there, SIGABRT "exception not rethrown")."""
import os
import signal
import subprocess
import sys
import time

import pytest

from mlsys_jax.errors import INTERRUPTED, run_command

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# `mlsys-jax ARGS` with Python's own Ctrl-C handler: a test worker may run with SIGINT ignored,
# and a child inherits that (a terminal's process never does)
AS_A_TERMINAL_RUNS_IT = ("import runpy, signal, sys; "
                         "signal.signal(signal.SIGINT, signal.default_int_handler); "
                         "sys.argv = ['mlsys-jax', *sys.argv[1:]]; "
                         "runpy.run_module('mlsys_jax.cli', run_name='__main__')")


def _interrupted():
    raise KeyboardInterrupt


def test_run_command_says_interrupted_in_one_line(capsys):
    assert run_command(_interrupted) == INTERRUPTED == 130
    assert capsys.readouterr().err == "mlsys-jax: interrupted\n"


@pytest.mark.slow
def test_sigint_while_remat_compiles_exits_130_without_a_core_dump(tmp_path):
    err_path = tmp_path / "err.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", AS_A_TERMINAL_RUNS_IT, "remat",
             "examples/flax_gpt2.py:loss_tiny", "--budget", "60%"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 120
        while "compiling" not in err_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)                      # inside XLA's compile of the plans
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    text = err_path.read_text()
    assert code == 130, text[-500:]
    assert text.rstrip().splitlines()[-1] == "mlsys-jax: interrupted"
    assert "FATAL" not in text and "Traceback" not in text
