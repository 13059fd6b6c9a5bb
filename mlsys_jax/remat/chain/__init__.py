"""The lecture's N-layer chain: schedules as data, the chain DP, and the executors that run them."""
from mlsys_jax.remat.chain.jax_exec import run_jax
from mlsys_jax.remat.chain.optimal import optimal_chain, revolve_advances, solve_chain
from mlsys_jax.remat.chain.reference import ReferenceRun, chain_inputs, run_reference
from mlsys_jax.remat.chain.schedule import (Counts, Schedule, every_k, input_only, plan_length,
                                            sqrt_n, store_all)
from mlsys_jax.remat.chain.stack import chain

__all__ = ["Counts", "Schedule", "every_k", "input_only", "plan_length", "sqrt_n", "store_all",
           "ReferenceRun", "chain_inputs", "run_reference", "run_jax",
           "optimal_chain", "revolve_advances", "solve_chain", "chain"]
