"""Execution models (lecture §3, §8): graph executor, tape AD, graph-break capture."""
from __future__ import annotations

from mlsys_jax.execute.capture import BreakReason, Captured, ExplainOutput, capture, explain

__all__ = ["BreakReason", "Captured", "ExplainOutput", "capture", "explain"]
