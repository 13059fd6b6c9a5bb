"""mlsys-jax: see, measure and change how a deep-learning system works, in real JAX code.

Subpackages: ``ir`` (the jaxpr as the graph), ``cost`` (roofline cost model, liveness), ``passes``
(verified rewrites and search), ``execute`` (graph executor, tape AD, graph-break capture),
``remat`` (recomputation schedules), ``parallel`` (shard_map DP/TP/PP/ZeRO/3D), ``planning``
(how to split a step over N devices: ``mlsys_jax.plan``), ``models``; ``api``: the commands as
functions, ``mlsys_jax.inspect``, ``optimize``, ``remat``, ``shard`` (docs/api.md).
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "capture": ("mlsys_jax.execute.capture", "capture"),
    "explain": ("mlsys_jax.execute.capture", "explain"),
    "plan": ("mlsys_jax.planning.search", "plan"),
    # the Python API (docs/api.md); ``remat`` is also the package of the planners, which
    # answers the call (mlsys_jax/remat/__init__.py)
    "inspect": ("mlsys_jax.api", "inspect"),
    "optimize": ("mlsys_jax.api", "optimize"),
    "remat": ("mlsys_jax.remat", None),
    "shard": ("mlsys_jax.api", "shard"),
}


def __getattr__(name):  # PEP 562: import heavy parts (and JAX) only when used
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        module = importlib.import_module(mod)
        return module if attr is None else getattr(module, attr)
    raise AttributeError(f"module 'mlsys_jax' has no attribute {name!r}")

__all__ = ["__version__", *_LAZY]
