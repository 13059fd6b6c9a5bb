"""What a plan's compiled gradient really does: XLA's own figures, and the distance to ``jax.grad``
(``measure``, for one plan; a frontier reuses its compiled programs instead, ``programs``).

``compile_grad`` compiles ``jax.grad`` with respect to the parameters only and reads the
compiler's figures, ``memory_analysis().temp_size_in_bytes`` and ``cost_analysis()['flops']``.
"""
from __future__ import annotations

import jax

from mlsys_jax.remat.milp import Plan
from mlsys_jax.remat.planner.apply import check_plan, flat_applied
from mlsys_jax.remat.planner.flat import FlatLoss, flatten_loss
from mlsys_jax.remat.planner.graph import loss_graph
from mlsys_jax.remat.planner.programs import grad_difference


def compile_grad(fn, flat: FlatLoss):
    """``jax.jit(jax.grad(fn))`` compiled for the parameters only: (compiled, temp, flops)."""
    compiled = jax.jit(jax.grad(fn, argnums=0)).lower(flat.diff, flat.batch).compile()
    flops = (compiled.cost_analysis() or {}).get("flops", float("nan"))
    return compiled, int(compiled.memory_analysis().temp_size_in_bytes), float(flops)


def measure(loss_fn, the_plan: Plan, params, batch) -> dict:
    """Compiled temp bytes and FLOPs of the plan's gradient, and its distance to ``jax.grad``."""
    flat = flatten_loss(loss_fn, params, batch, "measure")
    graph = loss_graph(flat)
    check_plan(graph, the_plan)
    fn = flat_applied(graph, the_plan) if the_plan.recomputed else flat.fn
    compiled, temp, flops = compile_grad(fn, flat)
    grads = compiled(flat.diff, flat.batch)
    reference = jax.jit(jax.grad(flat.fn, argnums=0))(flat.diff, flat.batch)
    max_abs, rel = grad_difference(grads, reference)
    return {"compiled_temp_bytes": temp, "compiled_flops": flops, "grads_max_abs_diff": max_abs,
            "grads_max_rel_diff": rel, "grads": flat.unflatten(grads), "compiled": compiled}
