"""The lecture's parallel steps, written out with ``jax.shard_map`` (§5, §7.3-7.4): data
parallelism (``data``), Megatron tensor parallelism (``tensor``), ZeRO 1-3 on a flat parameter
vector (``zero``), the pipeline executor (``pipeline``, running :mod:`mlsys_jax.parallel.schedules`)
and 3D (``threed``). Experiments 04 and the benchmarks use them; a user's own step goes through
:mod:`mlsys_jax.parallel.shard` and :mod:`mlsys_jax.parallel.pipe`, which import nothing from here.
"""

# the lecture's steps are modules: import the one a section uses (data, tensor, zero, ...)
__all__ = ["data", "tensor", "zero", "pipeline", "threed"]
