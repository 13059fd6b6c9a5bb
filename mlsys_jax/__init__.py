"""mlsys-jax: see, measure and change how a deep-learning system works, in real JAX code.

Subpackages: ``ir`` (the jaxpr as the graph), ``cost`` (roofline cost model, liveness), ``passes``
(verified rewrites and search), ``execute`` (graph executor, tape AD, graph-break capture),
``remat`` (recomputation schedules), ``parallel`` (shard_map DP/TP/PP/ZeRO/3D), ``planning``
(how to split a step over N devices: ``mlsys_jax.plan``), ``models``.
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "capture": ("mlsys_jax.execute.capture", "capture"),
    "explain": ("mlsys_jax.execute.capture", "explain"),
    "plan": ("mlsys_jax.planning.search", "plan"),
}


def __getattr__(name):  # PEP 562: import heavy parts (and JAX) only when used
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        return getattr(importlib.import_module(mod), attr)
    raise AttributeError(f"module 'mlsys_jax' has no attribute {name!r}")

__all__ = ["__version__", *_LAZY]
