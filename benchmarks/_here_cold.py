"""``inspect --hw here`` on a cold cache against what a user's own first run costs (a figure of
``bench passes``): fresh processes in paired rounds — one builds the model, compiles it with
``jax.jit`` (``eqx.filter_jit``: equinox models hold non-array leaves) and calls it once; the
other runs ``mlsys-jax inspect FILE:FN --hw here --json`` with an empty cache directory (every
kernel, the dispatch overheads and the CPU's roofline measured). The median of the per-round
ratios is ``here_cold_inspect_over_build_compile_call_ratio`` (target ≤ 1.5).
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlsys_jax import timing

ROOT = Path(__file__).resolve().parents[1]
TARGET = "benchmarks/_here_models_unseen.py:equinox_vit_loss"
BASELINE = """
import importlib.util, sys
import equinox as eqx, jax
path, name = sys.argv[1].split(":")
spec = importlib.util.spec_from_file_location("user", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
f, args = getattr(module, name)()
jax.block_until_ready(eqx.filter_jit(f)(*args))
"""


def _seconds(cmd: list, env: dict) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} failed: {done.stderr.strip()[-300:]}")
    return time.perf_counter() - t0


def cold_ratio(target: str = TARGET, rounds: int = 3) -> tuple[dict, list]:
    """Paired rounds of (cold ``inspect --hw here``, build + compile + one call)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERAS_BACKEND": "jax"}
    pairs, here_s, base_s = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="mlsys-jax-cold-") as tmp:
            cold = {**env, "XDG_CACHE_HOME": tmp}
            here = _seconds([sys.executable, "-m", "mlsys_jax.cli", "inspect", target,
                             "--hw", "here", "--json", "--quiet"], cold)
        base = _seconds([sys.executable, "-c", BASELINE, target], env)
        pairs.append(here / base)
        here_s.append(here)
        base_s.append(base)
    r = timing.Ratio(statistics.median(pairs), min(pairs), max(pairs))
    note = (f"cold `inspect {target} --hw here` (empty cache: every kernel of the fused set, the "
            f"dispatch overheads and the roofline measured) over a process that builds, "
            f"compiles and calls the model once, {rounds} paired rounds: {r.median:.3g} "
            f"[{r.low:.3g}–{r.high:.3g}] (target ≤ 1.5); medians {statistics.median(here_s):.1f} s "
            f"and {statistics.median(base_s):.1f} s")
    return {"here_cold_inspect_over_build_compile_call_ratio": r.to_dict()}, [note]


if __name__ == "__main__":
    figures, notes = cold_ratio(rounds=int(sys.argv[1]) if len(sys.argv) > 1 else 3)
    print(figures, *notes, sep="\n")
