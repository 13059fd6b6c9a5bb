"""Experiment 03's residual MILP: which values JAX keeps between forward and backward (§7.2, A1).

This is the lecture's two-stage view, checked by JAX's own residual count. It does not change
the compiled program on XLA:CPU (the recomputation of one whole-function ``jax.checkpoint`` is
merged back into the forward); plans for users' models that survive the compiler are
``planner`` (segments, chosen on the compiled program).

Checkmate (Jain et al. 2020) decides, per stage, which values to recompute, store or free. JAX's
mechanism — ``jax.checkpoint`` with ``save_only_these_names`` — can express one decision per
value: *save it* for the backward, or *recompute it* (once, from saved values and the arguments)
before the backward. That is the MILP of ``milp`` with one stage whose units are the values:

    minimise   Σ_v (flops_v + 1)·r_v  (+ a tie-break of < 1 for saved bytes)
    subject to s_u + r_u ≥ 1                 every value u the backward reads (JAX's residuals)
               r_v ≤ s_w + r_w               a recomputed v needs each forward input w
               Σ_v bytes_v·s_v ≤ budget − argument bytes

with binary s (save) and r (recompute), solved by ``scipy.optimize.milp`` (HiGHS). FLOPs per
equation come from the cost model. The predicted peak is the bytes held from the forward to the
backward (arguments + saved values); ``measure`` reads JAX's actual residuals and XLA's temp bytes.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import jax
from jax.ad_checkpoint import checkpoint_name
import numpy as np

from mlsys_jax import cost, ir
from mlsys_jax.compat import DropVar, Literal, bind_equation, saved_residuals
from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.milp import Plan, StagedMILP, solver

_PREFIX = "remat_v"


def _check_differentiable(fn, args) -> "ir.Traced":
    leaves = jax.tree_util.tree_leaves(args)
    if not leaves or not all(hasattr(a, "dtype") for a in leaves):
        raise MlsysError("plan: pass the function's arguments as arrays (or pytrees of arrays)")
    traced = ir.trace_tree(fn, *args)
    outs = traced.closed.out_avals
    if len(outs) != 1 or outs[0].shape != () or not np.issubdtype(outs[0].dtype, np.floating):
        got = ", ".join(a.str_short() for a in outs)
        raise MlsysError(f"plan: fn must return one float scalar (a loss) to be differentiable; "
                         f"it returns {got}. Reduce the output to a float scalar loss")
    if not any(np.issubdtype(a.dtype, np.floating) for a in leaves):
        raise MlsysError("plan: fn has no float argument, so it is not differentiable; "
                         "pass float parameters or inputs")
    return traced


def _named(closed):
    """fn rebuilt from its jaxpr with every top-level value wrapped in checkpoint_name."""
    index = {id(e): i for i, e in enumerate(closed.jaxpr.eqns)}

    def handler(eqn, invals):
        outs, i = bind_equation(eqn, invals), index[id(eqn)]
        return [checkpoint_name(o, f"{_PREFIX}{i}_{j}")
                for j, o in enumerate(outs)]

    def named_fn(*args):
        flat = jax.tree_util.tree_leaves(args)
        return ir.interpret(closed, *flat, handler=handler)[0]
    return named_fn


def _residuals(fn, args) -> tuple[dict[str, int], int, int]:
    """What JAX keeps for the backward: named values (name -> bytes), argument bytes, other bytes."""
    named, arg_bytes, other = {}, 0, 0
    for aval, src in saved_residuals(fn, *args):
        nbytes = ir.aval_bytes(aval)
        if src.startswith("named '"):
            named[src.split("'")[1]] = named.get(src.split("'")[1], 0) + nbytes
        elif src.startswith("from the argument"):
            arg_bytes += nbytes
        else:
            other += nbytes
    return named, arg_bytes, other


@dataclass(frozen=True)
class ResidualProblem:
    """The MILP of one function: its named values and JAX's residuals as one stage (``milp``)."""

    names: tuple[str, ...]
    milp: StagedMILP               # items and units are the values; offset: the arguments
    arg_bytes: int
    store_all_bytes: int

    @property
    def flops(self) -> np.ndarray:
        """FLOPs to recompute each unit."""
        return self.milp.unit_flops

    @property
    def nbytes(self) -> np.ndarray:
        """Bytes each value occupies when saved."""
        return self.milp.item_bytes

    def solve(self, peak_budget_bytes: int) -> Plan:
        """The plan minimising recompute FLOPs with at most ``peak_budget_bytes`` held for backward."""
        if peak_budget_bytes < self.arg_bytes:
            raise MlsysError(f"plan: peak_budget_bytes={peak_budget_bytes} is below the minimum feasible "
                             f"{self.arg_bytes} bytes (the arguments the backward reads, every "
                             f"other value recomputed); raise the budget to at least {self.arg_bytes}")
        t0 = time.perf_counter()
        sol = self.milp.solve(peak_budget_bytes)
        seconds = time.perf_counter() - t0
        if not sol.found:
            raise MlsysError(f"plan: no plan within {peak_budget_bytes} bytes (HiGHS status "
                             f"{sol.status})")
        s, r, names = sol.s, sol.r, np.asarray(self.names)
        return Plan(int(peak_budget_bytes), (0,), tuple(names[s]), tuple(names[r]),
                    int(self.arg_bytes + self.nbytes[s].sum()), int(self.flops[r].sum()),
                    int(self.arg_bytes), int(self.store_all_bytes), len(self.names), seconds,
                    optimality_gap=sol.gap, pin=None)


def problem(fn, *args) -> ResidualProblem:
    """Trace ``fn``, find the values its backward reads, and build the MILP (budget left open)."""
    solver()                                         # a missing scipy fails before any work
    traced = _check_differentiable(fn, args)
    closed = traced.closed
    named_fn = _named(closed)
    everything = jax.checkpoint(named_fn, policy=jax.checkpoint_policies.everything_saveable)
    residuals = _residuals(everything, args)[0]
    _, arg_bytes, _ = _residuals(
        jax.checkpoint(named_fn, policy=jax.checkpoint_policies.nothing_saveable), args)
    store_all = sum(_residuals(fn, args)[1:])       # plain fn: every residual is unnamed

    values, producer = [], {}
    for i, eqn in enumerate(closed.jaxpr.eqns):
        for j, v in enumerate(eqn.outvars):
            if not isinstance(v, DropVar):
                producer[v] = len(values)
                values.append((f"{_PREFIX}{i}_{j}", eqn, v))
    n = len(values)
    flops = np.array([cost.eqn_cost(e).flops for _, e, _ in values], dtype=np.float64)
    nbytes = np.array([ir.aval_bytes(v.aval) for _, _, v in values], dtype=np.float64)
    covers = tuple((k, k) for k, (name, _, _) in enumerate(values) if name in residuals)
    needs = tuple((k, producer[w], producer[w]) for k, (_, eqn, _) in enumerate(values)
                  for w in {w for w in eqn.invars if not isinstance(w, Literal) and w in producer})
    one_stage = np.zeros(n, dtype=np.int64)
    model = StagedMILP(nbytes, one_stage, np.zeros(n, bool), flops, np.zeros(n), one_stage,
                       covers, needs, offset_bytes=float(arg_bytes))
    return ResidualProblem(tuple(name for name, _, _ in values), model, int(arg_bytes),
                           int(store_all))


def plan(fn, *args, peak_budget_bytes: int) -> Plan:
    """Choose saved values for ``jax.grad(fn)(*args)`` under ``peak_budget_bytes`` (scipy's HiGHS)."""
    return problem(fn, *args).solve(peak_budget_bytes)


def apply(fn, the_plan: Plan, *example_args):
    """``fn`` whose gradient keeps exactly the plan's values (checkpoint names + policy)."""
    traced = _check_differentiable(fn, example_args)
    named_fn = _named(traced.closed)
    return jax.checkpoint(named_fn, policy=jax.checkpoint_policies.save_only_these_names(
        *the_plan.saved))


def measure(fn, the_plan: Plan, *args) -> dict:
    """What JAX actually keeps under the plan, and XLA's temp bytes for the jitted gradient."""
    applied = apply(fn, the_plan, *args)
    named, arg_bytes, other = _residuals(applied, args)
    grad = jax.jit(jax.grad(applied, argnums=tuple(range(len(args)))))
    compiled = grad.lower(*args).compile()        # run the compiled object: one compile, not two
    temp = compiled.memory_analysis().temp_size_in_bytes
    return {"saved_names": tuple(sorted(named)), "saved_count": len(named),
            "peak_bytes": int(sum(named.values()) + arg_bytes + other), "xla_temp_bytes": int(temp),
            "grads": compiled(*args)}
