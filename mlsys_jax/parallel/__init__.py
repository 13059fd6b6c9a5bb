"""Parallelism on a real engine: DP, TP, PP, ZeRO and 3D with ``jax.shard_map`` (lecture §5, §7.3-7.4).

Three wings on a shared floor. ``lecture/`` holds the lecture's steps (data, tensor, ZeRO,
pipeline, 3D) written with ``shard_map``; ``shard/`` runs a user's own optax step on a mesh with
``jax.jit`` + ``NamedSharding`` (``simulate``), laid out by partition rules (``megatron_rules``
derives Megatron's); ``pipe/`` runs it as pipeline stages. The floor: ``mesh`` (validated
meshes), ``comm`` (collective bytes in compiled HLO), ``schedules`` (pipeline schedules and the
action table as data), ``workers``/``multiprocess`` (process launch). ``shard`` and ``pipe``
never import ``lecture``. Two tables are data every wing reads: ``stages`` (what ZeRO stage k
shards, and the per-device formula) and ``axes`` (the mesh-axis names and which each path
accepts).

The names below load on first use (PEP 562), so ``stages`` and ``axes`` import without JAX: the
CLI builds its ``--zero`` choices from the table before ``--devices`` has started JAX.
"""
from __future__ import annotations

_LAZY = {"make_mesh": "mesh", "require_axes": "mesh", "validate_divisible": "mesh",
         "axis_size": "mesh", "apply_rules": "shard", "megatron_rules": "shard",
         "simulate": "shard", "ShardOptions": "shard", "ShardReport": "shard"}
__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"mlsys_jax.parallel.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'mlsys_jax.parallel' has no attribute {name!r}")
