"""The JAX executor: a schedule applied with ``jax.checkpoint`` and measured three ways.

A schedule's ``jax_plan`` becomes nested checkpoints (``stack.run_scanned``, the same code that
runs a user's layer stack); runs of layers are ``lax.scan`` and repeated identical segments an
outer scan, i.e. ``scan(checkpoint(scan(layer)))`` — on XLA:CPU an unrolled Python loop lets CSE
delete the recompute and the memory saving vanishes.

Measured: (1) saved residuals (the leaves of the VJP closure, in activation-sized units),
(2) layer forwards by walking the gradient jaxpr (tanh count × enclosing scan lengths — JAX's
convention: every checkpointed segment is recomputed whole, its last layer too), and (3) XLA's
``memory_analysis().temp_size_in_bytes`` of the jitted gradient.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.ir.walk import bodies
from mlsys_jax.remat.chain.schedule import Schedule
from mlsys_jax.remat.chain.stack import run_scanned


def tanh_layer(w, h):
    """The lecture's layer h' = tanh(h W)."""
    return jnp.tanh(h @ w)


def chain_loss(schedule: Schedule):
    """loss(ws, x) = ½‖h_N‖² for the tanh chain, with the schedule's checkpoints applied."""
    def loss(ws, x):
        h = run_scanned(schedule.jax_plan, tanh_layer, ws, x)
        return 0.5 * jnp.sum(h * h)
    return loss


def count_primitive(jaxpr, name: str) -> int:
    """Executions of primitive ``name`` in a jaxpr, nested jaxprs included, scan bodies × length."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == name:
            total += 1
        mult = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        total += sum(mult * count_primitive(body.jaxpr, name) for body in bodies(eqn))
    return total


@dataclass(frozen=True)
class JaxRun:
    """What the JAX executor measured for one schedule."""

    grads: np.ndarray
    saved_activation_units: float   # residual bytes of activation shape / bytes of one activation
    layer_forwards: int             # tanh executions in the gradient jaxpr (JAX's convention)
    xla_temp_bytes: int | None      # XLA's temp buffer size for the jitted gradient


def saved_activation_units(fn, ws, x) -> float:
    """Residuals the VJP keeps, in units of one activation (leaves shaped like the activations)."""
    res = jax.tree_util.tree_leaves(jax.eval_shape(lambda w, v: jax.vjp(fn, w, v)[1], ws, x))
    act = x.shape
    units = [np.prod(r.shape) / np.prod(act) for r in res if tuple(r.shape[-len(act):]) == act]
    return float(sum(units))


def run_jax(schedule: Schedule, x, ws, compile_memory: bool = True) -> JaxRun:
    """Gradient of the chain under ``schedule`` with jax.checkpoint, plus the three measurements."""
    x = jnp.asarray(x)
    ws = jnp.asarray(ws)
    loss = chain_loss(schedule)
    traced = jax.jit(jax.grad(loss)).trace(ws, x)      # one trace: the jaxpr and the program
    forwards = count_primitive(traced.jaxpr.jaxpr, "tanh")
    compiled = traced.lower().compile()
    temp = int(compiled.memory_analysis().temp_size_in_bytes) if compile_memory else None
    return JaxRun(np.asarray(compiled(ws, x)), saved_activation_units(loss, ws, x), forwards, temp)
