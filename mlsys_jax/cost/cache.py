"""What this machine measured, kept on disk: ``$XDG_CACHE_HOME/mlsys-jax/`` (``~/.cache`` by
default), one JSON file per kind of figure, keyed by what the figures depend on.

A measurement made on another JAX or jaxlib, another backend or device kind, another CPU or other
XLA flags says nothing about this one, so :func:`identity` names all of them and every cache file
is keyed by it. Writes merge with what is on disk (another process may have measured kernels
meanwhile) and replace the file atomically, so a reader never sees half a file.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/mlsys-jax`` (``~/.cache/mlsys-jax`` without the variable)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mlsys-jax"


@functools.cache
def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> str:
    """A digest of the CPU's instruction-set flags (``/proc/cpuinfo``: AVX-512 or not changes
    what XLA:CPU emits), empty where the system does not list them."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    words = sorted(line.split(":", 1)[1].split())
                    return hashlib.sha256(" ".join(words).encode()).hexdigest()[:12]
    except OSError:
        pass
    return ""


def identity() -> dict:
    """What a measured time depends on besides the program: JAX and jaxlib, the backend and
    device kind JAX runs on (``jax.devices()[0]``), the CPU, its instruction-set flags and core
    count, and XLA_FLAGS."""
    import jax

    try:
        from importlib.metadata import version
        jaxlib = version("jaxlib")
    except Exception:  # an unusual install: the JAX version still keys the cache
        jaxlib = "?"
    dev = jax.devices()[0]
    flags = os.environ.get("XLA_FLAGS", "")
    return {"jax": jax.__version__, "jaxlib": jaxlib, "platform": dev.platform,
            "device_kind": getattr(dev, "device_kind", dev.platform), "cpu": cpu_name(),
            "cpu_flags": cpu_flags(), "cores": os.cpu_count(),
            "xla_flags": hashlib.sha256(flags.encode()).hexdigest()[:12] if flags else ""}


def identity_key(ident: dict) -> str:
    """A short digest of :func:`identity` (a file name part)."""
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def load(path: Path, ident: dict) -> dict:
    """The entries of a cache file written under ``ident``; empty when the file is missing or
    written by another identity, and when it is unreadable (said in one line)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return _unusable(path, f"{type(e).__name__}: {str(e)[:80]}")
    if not isinstance(data, dict) or not isinstance(data.get("entries", {}), dict):
        return _unusable(path, "not a cache file's structure")
    if data.get("identity") != ident:
        return {}                         # another machine's or JAX's figures: not ours
    return data.get("entries", {})


def _unusable(path: Path, why: str) -> dict:
    """One line on stderr for a cache file that cannot be read; its figures are measured again
    (and the file rewritten when they are stored)."""
    import sys

    print(f"mlsys-jax: note: the cache file {path} is unusable ({why}); measuring again",
          file=sys.stderr)
    return {}


def finite(x, *, positive: bool = True) -> bool:
    """A cached figure is a real number: finite, and positive (or >= 0 when not ``positive``)."""
    import math

    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return ok and (x > 0 if positive else x >= 0)


def store(path: Path, ident: dict, entries: dict) -> bool:
    """Merge ``entries`` into the file (what is on disk under the same identity is kept) and
    replace it atomically. Returns False when the cache cannot be written (read-only home): the
    figures are then measured again next time, nothing else changes."""
    merged = {**load(path, ident), **entries}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a cache is an ordinary file
        with os.fdopen(fd, "w") as f:
            json.dump({"identity": ident, "entries": merged}, f)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        return False
    return True
