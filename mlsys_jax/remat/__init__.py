"""Rematerialization (lecture §7.2): schedules as data, executors, planners that survive XLA.

Three sub-systems share one MILP and one ``Plan`` (``milp``):

* ``chain/`` — the lecture's N-layer chain: schedules as action programs (``schedule``: store_all,
  every_k, sqrt_n, input_only), the budgeted chain DP (``optimal``, Revolve/rotor style), the NumPy
  reference executor that counts (``reference``), the same schedules through ``jax.checkpoint``
  (``jax_exec``) and on a user's layer stack (``stack``: a list of layers, or one layer scanned
  over stacked parameters);
* ``two_stage`` — experiment 03's view: each value saved or recomputed once, applied with
  ``jax.checkpoint``'s names policy and checked against JAX's own residuals;
* ``planner/`` — plans for a user's loss that survive XLA: the loss as flat arrays (``flat``) and
  as a recomputation graph (``graph``), the MILP over segments (``segments``), plans applied as
  pinned ``custom_vjp`` segments (``apply``, with ``xla_remat``), compiled and measured
  (``measure``), chosen on the compiled frontier (``frontier``) beside JAX's built-in policies
  (``policies``).
"""
import importlib
import sys
import types

from mlsys_jax.remat.chain import (Counts, ReferenceRun, Schedule, chain, chain_inputs, every_k,
                                   input_only, optimal_chain, plan_length, revolve_advances,
                                   run_jax, run_reference, solve_chain, sqrt_n, store_all)
from mlsys_jax.remat.milp import Plan
from mlsys_jax.remat.planner import Frontier, apply, measure, plan

__all__ = ["Counts", "Schedule", "every_k", "input_only", "plan_length", "sqrt_n", "store_all",
           "ReferenceRun", "chain_inputs", "run_reference", "run_jax",
           "optimal_chain", "revolve_advances", "solve_chain",
           "Frontier", "Plan", "apply", "chain", "measure", "plan"]


class _CallablePackage(types.ModuleType):
    """``mlsys_jax.remat`` is this package and also the Python API's function
    ``mlsys_jax.remat(loss_fn, params, batch, budget=...)`` (docs/api.md): the package answers
    the call. The API (``mlsys_jax.api``) sits above every layer, so it is imported by name when
    called, never by an import statement here."""

    def __call__(self, *args, **kwargs):
        return importlib.import_module("mlsys_jax.api").remat(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
