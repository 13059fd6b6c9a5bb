"""Test-session set-up: 8 simulated CPU devices and float64, before JAX starts (docs/jax-notes.md)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlsys_jax import runtime  # noqa: E402

runtime.configure(devices=runtime.DEFAULT_DEVICES, x64=True)
