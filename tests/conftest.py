"""Test-session set-up: 8 simulated CPU devices and float64, before JAX starts (docs/jax-notes.md),
and the test tiers: every test under ``tests/ecosystem/`` is marked ``ecosystem``, and the long
tiers are collected first."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlsys_jax import runtime  # noqa: E402

runtime.configure(devices=runtime.DEFAULT_DEVICES, x64=True)

ECOSYSTEM = Path(__file__).resolve().parent / "ecosystem"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if ECOSYSTEM in Path(item.path).parents:
            item.add_marker(pytest.mark.ecosystem)
    # The long files first (campaign tiers, then users' models): the two workers take files in
    # this order, so the suite ends on short files rather than one worker finishing a long one
    # alone. A stable sort: within a tier, files and tests keep their order.
    items.sort(key=lambda item: 0 if item.get_closest_marker("campaign") else
               1 if item.get_closest_marker("ecosystem") else 2)
