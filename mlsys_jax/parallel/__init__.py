"""Parallelism on a real engine: DP, TP, PP, ZeRO and 3D with ``jax.shard_map`` (lecture §5, §7.3-7.4).

Three wings on a shared floor. ``lecture/`` holds the lecture's steps (data, tensor, ZeRO,
pipeline, 3D) written with ``shard_map``; ``shard/`` runs a user's own optax step on a mesh with
``jax.jit`` + ``NamedSharding`` (``simulate``), laid out by partition rules (``megatron_rules``
derives Megatron's); ``pipe/`` runs it as pipeline stages. The floor: ``mesh`` (validated
meshes), ``comm`` (collective bytes in compiled HLO), ``schedules`` (pipeline schedules and the
action table as data), ``workers``/``multiprocess`` (process launch). ``shard`` and ``pipe``
never import ``lecture``.
"""
from mlsys_jax.parallel.mesh import axis_size, make_mesh, require_axes, validate_divisible
from mlsys_jax.parallel.shard import ShardReport, apply_rules, megatron_rules, simulate

__all__ = ["make_mesh", "require_axes", "validate_divisible", "axis_size", "apply_rules",
           "megatron_rules", "simulate", "ShardReport"]
