"""3D parallelism (lecture §5.4): data × tensor × pipeline on one mesh, one optax training step.

The model is a stack of residual Megatron MLP blocks, ``a + relu(a W1 + b1) W2 + b2``, one block
per pipeline stage. Inside one ``shard_map`` over ('data', 'model', 'pipe') — tensor parallelism
runs over the vocabulary's ``model`` axis (``parallel/axes.py``):

- pipeline: the stages run a 1F1B (or GPipe) schedule with ``ppermute`` between neighbours
  (:func:`mlsys_jax.parallel.lecture.pipeline.run_schedule`);
- tensor: W1 is split by columns and W2 by rows, so each block needs one ``psum`` over 'model'
  in the forward (§5.2); the backward's psum of the input cotangent comes from JAX's transpose;
- data: each data shard runs the pipeline on its slice of the batch; the parameters are marked
  varying over 'data' first, so gradients stay per shard until one ``psum`` after all microbatches.

The optax update runs on the resulting sharded gradients in the same jit.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import DATA, LECTURE_3D_AXES, MODEL, PIPE
from mlsys_jax.parallel.mesh import require_axes, validate_divisible
from mlsys_jax.parallel.schedules import make_schedule
from mlsys_jax.parallel.lecture.pipeline import (action_arrays, buffer_rows, mse_loss, run_schedule,
                                             sequential_value_and_grad, split_microbatches)

# How each stacked parameter [stage, ...] is laid out: stages over 'pipe', Megatron over 'model'.
PARAM_SPECS = {"w1": P(PIPE, None, MODEL), "b1": P(PIPE, MODEL),
               "w2": P(PIPE, MODEL, None), "b2": P(PIPE, None)}


class StepResult(NamedTuple):
    loss: jax.Array
    grads: dict
    params: dict
    opt_state: object


def init_params(rng: np.random.Generator, stages: int, width: int, hidden: int, dtype) -> dict:
    """Stacked block parameters (host arrays): w1 [stages, width, hidden], w2 [stages, hidden,
    width], b1 [stages, hidden], b2 [stages, width]."""
    shapes = {"w1": ((stages, width, hidden), 1 / np.sqrt(width)), "b1": ((stages, hidden), 0.1),
              "w2": ((stages, hidden, width), 1 / np.sqrt(hidden)), "b2": ((stages, width), 0.1)}
    return {k: (scale * rng.standard_normal(shape)).astype(dtype)
            for k, (shape, scale) in shapes.items()}


def block(params, a, tensor_axis: str | None = None):
    """Residual MLP block; with ``tensor_axis`` the weights are Megatron shards (one psum)."""
    partial = jax.nn.relu(a @ params["w1"] + params["b1"]) @ params["w2"]
    if tensor_axis is not None:
        partial = lax.psum(partial, tensor_axis)  # §5.2: row-parallel W2 needs one all-reduce
    return a + partial + params["b2"]


def single_device_step(params, opt_state, x, y, tx: optax.GradientTransformation) -> StepResult:
    """The reference: the same blocks in order on one device, one optax update."""
    loss, grads = sequential_value_and_grad(block, mse_loss, params, x, y)
    updates, opt_state = tx.update(grads, opt_state, params)
    return StepResult(loss, grads, optax.apply_updates(params, updates), opt_state)


def make_3d_step(mesh: Mesh, tx: optax.GradientTransformation, microbatches: int,
                 batch: int, schedule: str = "1f1b") -> Callable:
    """A jitted ``step(params, opt_state, x, y) -> StepResult`` on a (data, model, pipe) mesh."""
    require_axes(mesh, *LECTURE_3D_AXES, api="make_3d_step")
    data, stages = mesh.shape[DATA], mesh.shape[PIPE]
    local = validate_divisible(batch, data, "make_3d_step: batch over the 'data' axis")
    validate_divisible(local, microbatches, "make_3d_step: per-data-shard batch into microbatches")
    sched = make_schedule(schedule, stages, microbatches)
    columns = action_arrays(sched)
    rows = buffer_rows(columns)

    def body(params, x, y, columns):
        # Gradients per data shard until the end: one psum over 'data' per step, not per microbatch.
        mine = jax.tree.map(lambda p: lax.pcast(p[0], DATA, to="varying"), params)
        stage_fn = lambda p, a: block(p, a, tensor_axis=MODEL)
        loss, grads, _ = run_schedule(stage_fn, mse_loss, mine,
                                      split_microbatches(x, microbatches),
                                      split_microbatches(y, microbatches), columns, axis=PIPE,
                                      rows=rows, loss_scale=1.0 / (microbatches * data))
        grads = jax.tree.map(lambda g: lax.psum(g, DATA)[None], grads)
        return lax.psum(loss, DATA), grads

    col_specs = {k: P(None, PIPE) for k in columns}
    grad_fn = jax.shard_map(body, mesh=mesh,
                            in_specs=(PARAM_SPECS, P(DATA), P(DATA), col_specs),
                            out_specs=(P(), PARAM_SPECS))

    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = grad_fn(params, x, y, columns)
        updates, opt_state = tx.update(grads, opt_state, params)
        return StepResult(loss, grads, optax.apply_updates(params, updates), opt_state)

    return step


def compare_3d(devices=None, microbatches: int = 2, batch: int = 16, width: int = 8,
               hidden: int = 16, layout=(2, 2, 2), schedule: str = "1f1b") -> dict:
    """One float64 Adam step on a (data, model, pipe) mesh vs one device: max abs differences."""
    from mlsys_jax.parallel.mesh import make_mesh

    if hidden % layout[1]:
        raise MlsysError(f"compare_3d: hidden size {hidden} does not split over "
                         f"{MODEL}={layout[1]}")
    mesh = make_mesh(dict(zip(LECTURE_3D_AXES, layout)), devices=devices)
    rng = np.random.default_rng(0)
    params = init_params(rng, layout[2], width, hidden, np.float64)
    x, y = rng.standard_normal((2, batch, width))  # float64 host arrays
    tx = optax.adam(1e-2)
    step = make_3d_step(mesh, tx, microbatches, batch, schedule)
    # One compile each: optax's init inside the same jit as the step.
    ref = jax.jit(lambda p, x, y: single_device_step(p, tx.init(p), x, y, tx))(params, x, y)
    got = jax.jit(lambda p, x, y: step(p, tx.init(p), x, y))(params, x, y)
    diff = lambda a, b: float(np.max([np.max(np.abs(np.asarray(u) - np.asarray(v)))  # NaN kept
                                      for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b))]))
    return {"layout": dict(zip(LECTURE_3D_AXES, layout)), "loss": float(ref.loss),
            "loss_diff": abs(float(got.loss) - float(ref.loss)),
            "grad_diff": diff(got.grads, ref.grads), "param_diff": diff(got.params, ref.params),
            "param_change": diff(ref.params, params)}
