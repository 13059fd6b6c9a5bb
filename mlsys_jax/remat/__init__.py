"""Rematerialization (lecture §7.2): schedules as data, executors, planners that survive XLA.

``schedule``: store_all / every_k / sqrt_n / input_only as action programs; ``reference``: the
NumPy executor that counts; ``jax_exec``: the same schedules through jax.checkpoint, measured;
``optimal``: the budgeted chain DP (Revolve/rotor style); ``stack``: any schedule on a user's
layer stack (a list of layers, or one layer scanned over stacked parameters); ``planner``: the
segmented MILP over a user's loss (scipy's HiGHS, the ``solver`` extra); ``frontier``: plans
chosen on the compiled program (``plan``), ``compiled``: ``apply`` and ``measure``; ``policies``:
JAX's built-in policies beside the planner; ``two_stage``: the residual MILP of experiment 03.
"""
from mlsys_jax.remat.compiled import apply, measure
from mlsys_jax.remat.frontier import Frontier, plan
from mlsys_jax.remat.optimal import optimal_chain, revolve_advances, solve_chain
from mlsys_jax.remat.planner import Plan
from mlsys_jax.remat.reference import ReferenceRun, chain_inputs, run_reference
from mlsys_jax.remat.schedule import (Counts, Schedule, every_k, input_only, plan_length,
                                      sqrt_n, store_all)
from mlsys_jax.remat.stack import chain

__all__ = ["Counts", "Schedule", "every_k", "input_only", "plan_length", "sqrt_n", "store_all",
           "ReferenceRun", "chain_inputs", "run_reference",
           "optimal_chain", "revolve_advances", "solve_chain",
           "Frontier", "Plan", "apply", "chain", "measure", "plan"]
