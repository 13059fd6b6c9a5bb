"""``mlsys-jax shard``: a user's own optax training step on a simulated mesh, judged against one
device (``simulate``), with the dataflow analyses it rests on: which equations mix examples
(``batch_axis``), Megatron's splits (``tensor_split``), the user's annotations (``annotations``).
"""
from mlsys_jax.parallel.shard.options import ShardOptions
from mlsys_jax.parallel.shard.report import ShardReport
from mlsys_jax.parallel.shard.partition_rules import apply_rules, megatron_rules
from mlsys_jax.parallel.shard.simulate import separability_of, simulate

__all__ = ["apply_rules", "megatron_rules", "simulate", "separability_of", "ShardOptions",
           "ShardReport"]
