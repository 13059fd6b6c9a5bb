"""The report's pictures, drawn from each experiment's returned data (never re-measured).

One function per experiment id; each returns the PNG paths it wrote. matplotlib is optional.
"""
from __future__ import annotations

from mlsys_jax.viz import plots

PLOTTERS: dict = {}


def unavailable() -> str | None:
    """None when PNGs can be drawn, else the reason (shown in the report)."""
    return plots.unavailable_reason()


def plot(result, directory: str) -> list[str]:
    fn = PLOTTERS.get(result.id)
    return [p for p in (fn(result, directory) if fn else []) if p]
