"""Rematerialization (lecture §7.2): schedules as data, two executors, optimal planners.

``schedule``: store_all / every_k / sqrt_n / input_only as action programs; ``reference``: the
NumPy executor that counts; ``jax_exec``: the same schedules through jax.checkpoint, measured;
``optimal``: the budgeted chain DP (Revolve/rotor style); ``planner``: Checkmate-style MILP for
general jaxprs (``plan``/``apply``, needs scipy — the ``solver`` extra).
"""
from mlsys_jax.remat.optimal import optimal_chain, revolve_advances, solve_chain
from mlsys_jax.remat.reference import ReferenceRun, chain_inputs, run_reference
from mlsys_jax.remat.schedule import (Counts, Schedule, every_k, input_only, plan_length,
                                      sqrt_n, store_all)

__all__ = ["Counts", "Schedule", "every_k", "input_only", "plan_length", "sqrt_n", "store_all",
           "ReferenceRun", "chain_inputs", "run_reference",
           "optimal_chain", "revolve_advances", "solve_chain"]
