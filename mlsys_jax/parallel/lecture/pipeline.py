"""Execute a pipeline schedule as one SPMD program under ``jax.shard_map`` (lecture §5.3).

Every stage runs the same program: a ``lax.scan`` over the schedule's steps in which each device
reads its own column of the static action table and ``lax.switch``-es on idle / forward /
backward / backward-from-the-loss. A forward sends its output to the next stage and a backward
sends the input's cotangent to the previous one: two ``ppermute``\\ s per step. A backward
recomputes its stage's forward from the stashed input and takes ``jax.vjp`` of it (one microbatch
at a time), so the stash holds stage inputs only; its rows are allocated from the table, so 1F1B's
smaller in-flight count is a smaller buffer in the compiled program, not just a number.

:func:`run_schedule` is the per-device core (call it inside any shard_map, e.g. the 3D step);
:func:`pipeline_value_and_grad` wraps it for a mesh with just a pipeline axis.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

from mlsys_jax.compat import varying_axes
from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import PIPE
from mlsys_jax.parallel.mesh import require_axes
from mlsys_jax.parallel.schedules import (COLUMNS, IDLE,
                                          PipelineSchedule, action_arrays, buffer_rows,
                                          validate_pipeline, write_row)

class PipelineResult(NamedTuple):
    """Loss, gradients (stacked per stage), the idle steps each stage actually executed, and the
    rows of the activation stash (and of the cotangent buffer) the program allocated per device."""

    loss: Any
    grads: Any
    idle_steps: Any
    buffer_rows: int


def _vary(x, axes) -> Any:
    """Mark ``x`` as varying over ``axes`` (those it is not varying over yet)."""
    missing = tuple(a for a in axes if a not in varying_axes(x))
    return lax.pcast(x, missing, to="varying") if missing else x


def run_schedule(stage_fn: Callable, loss_fn: Callable, params, xs, ys, columns: dict, *,
                 axis: str, rows: int, loss_scale: float = 1.0):
    """Per-device body: run this device's column of a schedule; call inside shard_map.

    ``stage_fn(params, act) -> act`` (same shape: every stage hands on one activation shape),
    ``loss_fn(act, y) -> scalar`` on the last stage's output. ``xs``/``ys``: microbatches,
    ``[M, mb, ...]``. ``columns``: :func:`action_arrays` of the schedule, split over ``axis``
    (``[steps, 1]`` per device); ``rows``: :func:`buffer_rows` of them. The table is data, not
    code: schedules with equal steps and rows share one compiled program.
    Idle stages still join both ppermutes (sending zeros): the price of one SPMD program; a
    pipeline's real traffic is the 2·M·(P-1) activation-sized messages of its F and B actions.
    Returns (loss, grads, idle) where loss = loss_scale * sum_i loss_fn(microbatch i), summed
    over the pipeline, grads are this stage's parameter gradients of that loss, and idle counts
    the steps this device ran the idle branch (its bubble, as executed).
    """
    stage = lax.axis_index(axis)
    last = lax.axis_size(axis) - 1
    act_axes = tuple(varying_axes(xs)) + (axis,)
    # Stage 0 reads its inputs from xs; the others from the rows stage s-1's sends went to.
    stash = _vary(jnp.zeros((rows, *xs.shape[1:]), xs.dtype), act_axes)
    cot = stash
    zero_msg = _vary(jnp.zeros_like(xs[0]), act_axes)
    grads = jax.tree.map(lambda p: _vary(jnp.zeros_like(p), varying_axes(p)), params)
    loss = _vary(jnp.zeros((), xs.dtype), act_axes)

    def stage_input(i, r, stash):
        return jnp.where(stage == 0, xs[i], stash[r])

    def idle(i, r, stash, cot, grads, loss):
        return zero_msg, zero_msg, grads, loss

    def forward(i, r, stash, cot, grads, loss):
        out = _vary(stage_fn(params, stage_input(i, r, stash)), act_axes)
        return out, zero_msg, grads, loss

    def backward(i, r, stash, cot, grads, loss):
        _, vjp = jax.vjp(stage_fn, params, stage_input(i, r, stash))
        g_params, g_act = vjp(cot[r])
        return zero_msg, _vary(g_act, act_axes), jax.tree.map(jnp.add, grads, g_params), loss

    def backward_loss(i, r, stash, cot, grads, loss):
        def scaled_loss(p, a):
            return loss_fn(stage_fn(p, a), ys[i]) * loss_scale
        value, vjp = jax.vjp(scaled_loss, params, stage_input(i, r, stash))
        g_params, g_act = vjp(jnp.ones_like(value))
        return (zero_msg, _vary(g_act, act_axes), jax.tree.map(jnp.add, grads, g_params),
                loss + _vary(value, act_axes))

    fwd_perm = [(s, s + 1) for s in range(last)]
    bwd_perm = [(s + 1, s) for s in range(last)]

    def step(carry, col):
        stash, cot, grads, loss, idle_steps = carry
        op, mb, slot, recv_act, recv_grad = (c[0] for c in col)
        to_next, to_prev, grads, loss = lax.switch(
            op, (idle, forward, backward, backward_loss), mb, slot, stash, cot, grads, loss)
        stash = write_row(stash, recv_act, lax.ppermute(to_next, axis, fwd_perm))
        cot = write_row(cot, recv_grad, lax.ppermute(to_prev, axis, bwd_perm))
        return (stash, cot, grads, loss, idle_steps + (op == IDLE)), None

    cols = tuple(columns[k] for k in COLUMNS)
    idle_steps = _vary(jnp.zeros((), jnp.int32), (axis,))
    carry, _ = lax.scan(step, (stash, cot, grads, loss, idle_steps), cols)
    _, _, grads, loss, idle_steps = carry
    return lax.psum(loss, axis), grads, idle_steps


def pipeline_value_and_grad(schedule: PipelineSchedule, stage_fn: Callable, loss_fn: Callable,
                            stage_params, x, y, mesh: Mesh, axis: str = PIPE):
    """Loss and gradients of mean_i loss_fn(microbatch i) with stages on ``mesh[axis]``.

    ``stage_params``: a pytree whose leaves have a leading axis of size ``stages`` (stage s's
    parameters at index s). ``x``, ``y``: the whole batch, split into ``schedule.microbatches``
    equal microbatches. Returns a :class:`PipelineResult`: grads stacked like ``stage_params``,
    idle_steps of shape ``[stages]``, buffer_rows (GPipe: M; 1F1B: about P).
    """
    require_axes(mesh, axis, api="pipeline_value_and_grad")
    stages, m = schedule.stages, schedule.microbatches
    if mesh.shape[axis] != stages:
        raise MlsysError(f"pipeline_value_and_grad: schedule has {stages} stages but mesh axis "
                         f"{axis!r} has {mesh.shape[axis]} devices; make them equal")
    for leaf in jax.tree.leaves(stage_params):
        if leaf.shape[:1] != (stages,):
            raise MlsysError(f"pipeline_value_and_grad: every stage_params leaf needs a leading "
                             f"axis of {stages} (one slice per stage), got shape {leaf.shape}")
    _check_microbatches(x, m), _check_microbatches(y, m)  # before tracing: a clear error
    columns = action_arrays(schedule)
    rows = buffer_rows(columns)
    run = _executor(stage_fn, loss_fn, mesh, axis, m, rows, jax.tree.structure(stage_params))
    return PipelineResult(*run(stage_params, x, y, columns), buffer_rows=rows)


@functools.lru_cache(maxsize=32)
def _executor(stage_fn: Callable, loss_fn: Callable, mesh: Mesh, axis: str, microbatches: int,
              rows: int, treedef) -> Callable:
    """The jitted shard_map program; cached so that schedules of equal shape reuse it."""
    def body(params, xs, ys, columns):
        local = jax.tree.map(lambda p: p[0], params)
        loss, grads, idle = run_schedule(stage_fn, loss_fn, local, xs, ys, columns, axis=axis, rows=rows,
                                         loss_scale=1.0 / microbatches)
        return loss, jax.tree.map(lambda g: g[None], grads), idle[None]

    specs = jax.tree.unflatten(treedef, [P(axis)] * treedef.num_leaves)
    col_specs = {k: P(None, axis) for k in COLUMNS}
    fn = jax.shard_map(body, mesh=mesh, in_specs=(specs, P(), P(), col_specs),
                       out_specs=(P(), specs, P(axis)))
    return jax.jit(lambda p, x, y, c: fn(p, split_microbatches(x, microbatches),
                                         split_microbatches(y, microbatches), c))


def sequential_value_and_grad(stage_fn: Callable, loss_fn: Callable, stage_params, x, y):
    """The single-device model: all stages in order on one device, loss = mean over the batch.

    (With equal microbatches, the mean over microbatches of their mean losses is the same.)
    """
    stages = jax.tree.leaves(stage_params)[0].shape[0]

    def loss(params):
        a = x
        for s in range(stages):
            a = stage_fn(jax.tree.map(lambda p: p[s], params), a)  # noqa: B023 (called in this iteration)
        return loss_fn(a, y)

    return jax.value_and_grad(loss)(stage_params)


def tanh_chain_init(rng: np.random.Generator, layers: int, width: int, stages: int,
                    dtype) -> dict:
    """A chain of ``layers`` tanh(x @ W + b) layers, stacked as [stages, layers/stages, ...].

    Host (numpy) arrays: a jitted step places them straight onto its mesh; a device array would
    first be sliced by an extra compiled kernel per leaf.
    """
    validate_pipeline(stages, 1, layers, api="tanh_chain_init")
    if layers % stages:
        raise MlsysError(f"tanh_chain_init: {layers} layers do not split evenly over {stages} "
                         f"stages; use a multiple of {stages} layers")
    per = layers // stages
    # numpy's generator: eager jax.random would compile a dozen tiny kernels on every run
    w = rng.standard_normal((stages, per, width, width)) / np.sqrt(width)
    b = 0.1 * rng.standard_normal((stages, per, width))
    return {"w": w.astype(dtype), "b": b.astype(dtype)}


def tanh_chain_stage(params, a):
    """One stage of the chain: its layers in order."""
    for l in range(params["w"].shape[0]):
        a = jnp.tanh(a @ params["w"][l] + params["b"][l])
    return a


def mse_loss(a, y):
    """0.5 * squared error summed over features, mean over the (micro)batch."""
    return 0.5 * jnp.mean(jnp.sum((a - y) ** 2, axis=-1))


def split_microbatches(x, microbatches: int):
    """``[B, ...] -> [M, B/M, ...]``; a clear error when M does not divide the batch."""
    _check_microbatches(x, microbatches)
    return x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])


def _check_microbatches(x, microbatches: int) -> None:
    if x.shape[0] % microbatches:
        raise MlsysError(f"pipeline: batch of {x.shape[0]} does not split into {microbatches} "
                         f"equal microbatches; use a batch that is a multiple of {microbatches}")
