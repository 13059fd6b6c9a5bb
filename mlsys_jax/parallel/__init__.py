"""Parallelism on a real engine: DP, TP, PP, ZeRO and 3D with ``jax.shard_map`` (lecture §5, §7.3-7.4).

``mesh`` builds validated meshes; ``data``, ``tensor``, ``zero`` hold the training steps; ``comm``
counts collective bytes in compiled HLO; ``pipeline``/``threed`` hold schedules and 3D. A user's
own optax step runs on a mesh with ``jax.jit`` + ``NamedSharding`` through ``simulate``
(``parallel/shard/``), laid out by partition ``rules`` (``megatron_rules`` derives Megatron's).
"""
from mlsys_jax.parallel.mesh import axis_size, make_mesh, require_axes, validate_divisible
from mlsys_jax.parallel.shard import ShardReport, apply_rules, megatron_rules, simulate

__all__ = ["make_mesh", "require_axes", "validate_divisible", "axis_size", "apply_rules",
           "megatron_rules", "simulate", "ShardReport"]
