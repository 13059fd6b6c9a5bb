"""``optimize``'s peak memory scales with the parameters, not with how often they are checked.

Issue #39: a 512 MiB elementwise parameter (``sin(w) * 2 + sum(x)``, which ``fold_constants``
folds into a second 512 MiB constant) peaked at 9.2 GB, about 17 times the parameter: the value
check held every input set's outputs, their float64 copies and 8 rounding-noise runs at once.
Here at 64 MiB: the peak RSS of ``optimize`` in a fresh process (``wait4``'s ``ru_maxrss``) may
exceed a bare process by 4× the parameter's bytes (the parameter, its folded twin, two outputs of
its size) and a fixed allowance for what the CLI compiles and the check's chunked float64 work.
The factory run alone is the bare process and the parameter, so the bound is that run and 3×
more. (An asynchronous chain of folds held a dropped intermediate into the check: one parameter
more, which this bound refuses.)
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 1 << 20
PARAM_BYTES = 64 * MIB           # benchmarks/_big_params.py: elementwise_64mib
FIXED = 96 * MIB                 # compiled programs, the check's float64 chunks (measured ~60 MB)


def _peak_rss(*argv: str) -> int:
    """Peak RSS in bytes of ``python argv...`` run alone; fails on a non-zero exit."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert os.waitstatus_to_exitcode(status) == 0, err[-800:]
    return usage.ru_maxrss * 1024


@pytest.mark.slow
def test_optimize_peak_rss_within_four_parameters_of_a_bare_process():
    alone = _peak_rss("-m", "benchmarks._big_params", "elementwise_64mib")
    optimize = _peak_rss("-m", "mlsys_jax.cli", "optimize",
                         f"{ROOT}/benchmarks/_big_params.py:elementwise_64mib", "--hw", "cpu")
    bound = alone + 3 * PARAM_BYTES + FIXED
    assert optimize <= bound, (f"optimize peaked at {optimize / MIB:.0f} MiB; the factory alone "
                               f"{alone / MIB:.0f} MiB + 3 × 64 MiB + {FIXED // MIB} MiB = "
                               f"{bound / MIB:.0f} MiB")
