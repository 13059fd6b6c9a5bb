"""Test-session set-up: 8 simulated CPU devices and float64, before JAX starts (docs/jax-notes.md),
and the test tiers: every test under ``tests/ecosystem/`` is marked ``ecosystem``, and the long
tiers are collected first."""
import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# One XLA compilation cache for the whole session: the process that starts first makes it, and
# pytest-xdist's workers and every command a test runs as a process inherit it. Many tests
# compile the same programs (a model's step in-process and again behind the CLI); a hit skips
# XLA's compile, not the trace, and the executable is the one a compile would give. Cold at
# every session (nothing carried between runs) and removed at exit by the process that made it.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _XLA_CACHE = tempfile.mkdtemp(prefix="mlsys-jax-tests-xla-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    atexit.register(shutil.rmtree, _XLA_CACHE, ignore_errors=True)

# Text output follows the terminal's width (COLUMNS first), and pytest-xdist's workers inherit
# a COLUMNS of their own: the tests read text at one width, the one used off a terminal; a test
# of another width sets it itself.
os.environ["COLUMNS"] = "120"

from mlsys_jax import runtime  # noqa: E402

runtime.configure(devices=runtime.DEFAULT_DEVICES, x64=True)

ECOSYSTEM = Path(__file__).resolve().parent / "ecosystem"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ECOSYSTEM in Path(item.path).parents:
            item.add_marker(pytest.mark.ecosystem)
    # The long files first (campaign tiers, users' models, then files of slow tests): the two
    # workers take files in this order, so the suite ends on short files rather than one worker
    # finishing a long one alone. A stable sort: within a tier, files and tests keep their order.
    items.sort(key=lambda item: 0 if item.get_closest_marker("campaign") else
               1 if item.get_closest_marker("ecosystem") else
               2 if item.get_closest_marker("slow") else 3)
