"""``mlsys-jax shard``: a user's own optax training step on a simulated mesh, judged against one
device (``simulate``)."""
from mlsys_jax.parallel.shard.rules import apply_rules, megatron_rules
from mlsys_jax.parallel.shard.simulate import ShardReport, simulate

__all__ = ["apply_rules", "megatron_rules", "simulate", "ShardReport"]
