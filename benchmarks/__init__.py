"""The benchmarks: one ``bench_<name>.py`` each (``NAME``, ``run(quick=False) -> dict``), run side
by side by ``mlsys-jax bench`` (:mod:`benchmarks.runner`).

This module is what ``mlsys-jax bench --help`` reads, so it imports neither JAX nor the benchmarks
(they import JAX): the names come from the file names (:func:`discover`), what each measures from
its docstring's first sentence (:func:`title`), and how long each took when it last ran on this
machine from a small file the runner writes after every benchmark it completes
(:func:`record_run`, :func:`last_runs`). Run times are never typed in: a benchmark that has not
run here says so.
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import pkgutil
import platform
import tempfile
import time
from pathlib import Path

TIERS = ("full", "quick")  # run(quick=False) and run(quick=True): ``bench --quick``
TIMES_FILE = "bench_times.json"


@contextlib.contextmanager
def building():
    """Within: a benchmark builds a model whose traced graph alone it measures. Threefry's
    non-partitionable lowering (in this thread): the model's init compiles several times faster on
    XLA:CPU, and only its parameters' values differ; the graph is traced after, outside it."""
    import jax

    with jax.threefry_partitionable(False):
        yield


def discover() -> dict[str, str]:
    """Benchmark name -> module, for every ``benchmarks/bench_*.py``."""
    out = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("bench_"):
            out[info.name[len("bench_"):]] = f"{__name__}.{info.name}"
    return dict(sorted(out.items()))


def title(name: str) -> str:
    """What benchmark ``name`` measures: its docstring's first sentence, up to a colon (read from
    the file, so that listing the benchmarks imports none of them)."""
    path = Path(__path__[0]) / f"bench_{name}.py"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split()).replace("``", "").replace("`", "")
    first = first.split(": ")[0]
    return first.split(". ")[0].rstrip(".")


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/mlsys-jax``: the folder of ``mlsys_jax.cost.cache.cache_dir``, spelled
    here because importing ``mlsys_jax.cost`` starts JAX (a test checks the two agree)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlsys-jax"


def _read_times() -> dict:
    """The whole times file; missing or unreadable (a partial or hand-edited file) is empty."""
    try:
        data = json.loads((cache_dir() / TIMES_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def last_runs() -> dict[str, dict[str, float]]:
    """Benchmark -> tier -> seconds its last completed run took on this machine (this host)."""
    here = _read_times().get(platform.node(), {})
    out: dict[str, dict[str, float]] = {}
    for name, tiers in (here.items() if isinstance(here, dict) else ()):
        for tier, run in (tiers.items() if isinstance(tiers, dict) else ()):
            seconds = run.get("seconds") if isinstance(run, dict) else None
            if tier in TIERS and isinstance(seconds, (int, float)) and seconds >= 0:
                out.setdefault(name, {})[tier] = float(seconds)
    return out


def record_run(name: str, *, quick: bool, seconds: float) -> None:
    """Remember that benchmark ``name`` just completed in ``seconds`` (in its ``quick`` tier or
    the full one) on this host. Best effort: a cache that cannot be written loses only this."""
    data = _read_times()
    host = data.get(platform.node())
    host = data[platform.node()] = host if isinstance(host, dict) else {}
    runs = host.get(name)
    runs = host[name] = runs if isinstance(runs, dict) else {}
    runs[TIERS[bool(quick)]] = {
        "seconds": round(float(seconds), 2), "at": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(f.name, folder / TIMES_FILE)  # whole, or not at all
    except OSError:
        pass
