"""Commands run as processes of their own for a benchmark: wall time and the peak RSS of that
process alone (``os.wait4`` charges the child only)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# argv[1:] as a child; prints its peak RSS in bytes last
_LAUNCHER = ("import os, subprocess, sys\n"
             "child = subprocess.Popen(sys.argv[1:])\n"
             "_, status, usage = os.wait4(child.pid, 0)\n"
             "print(usage.ru_maxrss * 1024)\n"
             "sys.exit(os.waitstatus_to_exitcode(status))\n")


def timed(argv: list[str], *, ok=(0,), timeout_s: float = 3600) -> dict:
    """Run ``argv`` under the launcher: its stdout (less the RSS line), wall s, peak RSS and exit
    status (one of ``ok``, else RuntimeError with its stderr's end)."""
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], cwd=ROOT, capture_output=True,
                         text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if out.returncode not in ok:
        raise RuntimeError(f"{' '.join(argv[:8])} failed: {out.stderr[-1500:]}")
    *lines, rss = out.stdout.rstrip().splitlines()
    return {"stdout": "\n".join(lines), "wall_s": wall, "rss_bytes": int(rss),
            "code": out.returncode}


def cli(*args: str) -> list[str]:
    """``mlsys-jax ARGS`` as this interpreter runs it."""
    return [sys.executable, "-m", "mlsys_jax.cli", *args]
