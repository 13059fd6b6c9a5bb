"""Recomputation plans for a user's loss, chosen and checked on the compiled program."""
from mlsys_jax.remat.planner.apply import apply
from mlsys_jax.remat.planner.frontier import Frontier, plan
from mlsys_jax.remat.planner.measure import measure

__all__ = ["Frontier", "apply", "measure", "plan"]
