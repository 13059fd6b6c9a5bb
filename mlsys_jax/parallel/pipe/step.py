"""A user's training step as P pipeline stages: checked inputs, the split, the program, the state.

``plan_pipeline(loss_fn, params, batch, optimizer, {"data": 2, "pipe": 4}, microbatches=8)``
traces ``loss_fn`` on one microbatch, finds its units, splits them into stages (balanced by the
cost model, or at the user's split points), lays out parameters and optimizer state per stage
and builds the SPMD program. :class:`PipelinePlan` then runs steps from any one-device state
(parameters and optax state in the user's own trees) and returns them in the same trees. A
loss that draws random numbers and takes a ``deterministic`` keyword also gets
``dropout_off``: the same step planned with ``deterministic=True`` (``stochastic.py``).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlsys_jax.compat import jaxpr_as_fun
from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import DATA, PIPE, PIPE_AXES
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.shard.compare import leaf_diffs
from mlsys_jax.parallel.pipe.balance import (at_split_points, balanced, check_stage_count,
                                             unit_costs)
from mlsys_jax.parallel.pipe.flat import stack_host
from mlsys_jax.parallel.pipe.optim import PartitionedOptimizer
from mlsys_jax.parallel.pipe.placement import StageLeaves
from mlsys_jax.parallel.pipe.program import PipelineProgram
from mlsys_jax.parallel.pipe.split import Split, build_split
from mlsys_jax.parallel.pipe.stagefn import estimated_time_us
from mlsys_jax.parallel.pipe.stochastic import draws_random, off_switch, shared_leaves
from mlsys_jax.parallel.pipe.units import Units, find_units
from mlsys_jax.parallel.schedules import SCHEDULES, PipelineSchedule, make_schedule
from mlsys_jax.parallel.shard.inputs import combine, split_params


@dataclass
class PipelinePlan:
    """Everything decided before the first step runs (see the module docstring)."""

    loss: Callable                 # loss(trainable, batch), the static leaves closed over
    trainable: object
    treedef: object
    paths: list
    batch: object
    optimizer: optax.GradientTransformation
    mesh_shape: dict
    schedule: PipelineSchedule
    remat: bool
    units: Units
    stage_of_unit: tuple
    split: Split
    leaves: StageLeaves
    popt: PartitionedOptimizer
    program: PipelineProgram
    unit_costs: list
    stage_times_us: list
    hw: str
    split_given: bool
    compiled: dict = field(default_factory=dict)
    dropout_off: Callable | None = None   # () -> the same step planned with deterministic=True
    source: tuple = ()   # (the user's loss_fn, the leaves it is not trained on): one_device.py

    @property
    def stages(self) -> int:
        return self.schedule.stages

    @property
    def microbatches(self) -> int:
        return self.schedule.microbatches

    def microbatch_loss(self, trainable, batch):
        """The loss on one microbatch, evaluated from its traced jaxpr (what the stages run)."""
        out = jaxpr_as_fun(self.split.closed)(*jax.tree.leaves(trainable),
                                              *jax.tree.leaves(batch))
        return out[0]

    def with_schedule(self, schedule: str) -> "PipelinePlan":
        """The same split and layouts under another schedule (a new program)."""
        sched = make_schedule(schedule, self.stages, self.microbatches)
        program = PipelineProgram(self.split, self.leaves, self.popt, sched, self.program.mesh,
                                  self.remat, shared=self.program.shared)
        return dataclasses.replace(self, schedule=sched, program=program, compiled={})

    def place(self, trainable, opt_state) -> tuple:
        """Host arrays of a one-device state (parameters, optax state) laid out per stage."""
        own, rep = self.leaves.to_host(jax.tree.leaves(trainable))
        return (stack_host(own), stack_host([rep] * self.stages),
                stack_host(self.popt.state_to_stages(opt_state)))

    def compile(self, options: dict | None = None):
        key = repr(sorted((options or {}).items()))
        if key not in self.compiled:
            lead = (self.stages,)
            self.compiled[key] = self.program.compile(
                self.leaves.own[0].structs(lead), self.leaves.rep.structs(lead),
                self.popt.state_layouts[0].structs(lead), jax.tree.leaves(self.batch), options)
        return self.compiled[key]

    def step(self, trainable, opt_state, options: dict | None = None) -> dict:
        """One pipeline step from a one-device state: host values in the user's trees."""
        program = self.program
        out = self.compile(options)(*program.arguments(*self.place(trainable, opt_state),
                                                       jax.tree.leaves(self.batch)))
        own, rep, state, loss, gown, grep, idle, sends, log, log_mb = jax.device_get(out)
        per = lambda t: [{k: v[s] for k, v in t.items()} for s in range(self.stages)]
        unflat = lambda leaves: jax.tree.unflatten(self.treedef, leaves)
        reps = [self.leaves.from_host(per(own), r) for r in per(rep)]
        return {"loss": np.asarray(loss), "grads": unflat(self.leaves.from_host(per(gown),
                                                                              per(grep)[0])),
                "params": unflat(reps[0]), "opt_state": self.popt.state_from_stages(per(state)),
                "replica_spread": _spread(reps), "idle": np.asarray(idle),
                "sends": np.asarray(sends), "log": np.asarray(log), "log_mb": np.asarray(log_mb)}


def _spread(replicas) -> float:
    """Largest difference between the stages' copies of the replicated leaves (0 when equal; a
    NaN or Inf in one copy only, Inf: ``shard.compare.leaf_diffs``)."""
    return max((d for r in replicas[1:] for d in leaf_diffs(list(r), list(replicas[0]))),
               default=0.0)


def check_mesh(mesh_shape: dict) -> dict:
    unknown = [a for a in mesh_shape if a not in PIPE_AXES]
    if unknown or PIPE not in mesh_shape:
        raise MlsysError(f"pipeline: mesh axis {unknown[0]!r} is not one of data, pipe; use "
                         "--mesh [data=D,]pipe=P" if unknown else
                         "pipeline: the mesh needs a pipe axis: --mesh [data=D,]pipe=P")
    shape = {a: int(mesh_shape[a]) for a in PIPE_AXES if a in mesh_shape}
    size, have = int(np.prod(list(shape.values()))), jax.device_count()
    if any(v < 1 for v in shape.values()) or have % size:
        layout = ",".join(f"{k}={v}" for k, v in shape.items())
        raise MlsysError(f"--mesh {layout} uses {size} devices, which does not divide the {have} "
                         f"simulated devices; use pipe=P and data=D with D*P dividing {have} "
                         f"(e.g. pipe={max(d for d in (1, 2, 4, 8) if have % d == 0)}), or "
                         f"--devices {size}")
    return shape


def check_counts(batch, data: int, stages: int, microbatches, schedule: str) -> int:
    if schedule not in SCHEDULES:
        raise MlsysError(f"--schedule {schedule!r}: choose one of {', '.join(SCHEDULES)}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise MlsysError(f"--microbatches must be an integer >= 1, got {microbatches!r}")
    if microbatches < stages:
        raise MlsysError(f"--microbatches {microbatches} is fewer than the {stages} pipeline "
                         f"stages: the pipeline never fills; use --microbatches M with M >= "
                         f"{stages} (M = {4 * stages} gives a bubble of "
                         f"{(stages - 1) / (5 * stages - 1):.0%})")
    leaves = [x for x, one in zip(jax.tree.leaves(batch), shared_leaves(batch)) if not one]
    rows = {x.shape[0] if getattr(x, "ndim", 0) else None for x in leaves}
    if not leaves or len(rows) != 1 or None in rows:
        raise MlsysError("batch: every leaf needs the same leading batch axis (a PRNG key "
                         "aside); return e.g. {'x': x[B, ...], 'y': y[B]}")
    n = rows.pop()
    if n % (data * microbatches):
        raise MlsysError(f"the batch of {n} rows does not split into data={data} x "
                         f"{microbatches} microbatches; use a batch that is a multiple of "
                         f"{data * microbatches} (or fewer microbatches)")
    return n // (data * microbatches)


def trace_microbatch(loss, trainable, batch, rows: int):
    """The loss's jaxpr on one microbatch of ``rows``: inputs are the trainable leaves, then
    the batch's leaves."""
    flat, treedef = jax.tree.flatten(trainable)
    blv, bdef = jax.tree.flatten(batch)
    n = len(flat)

    def flat_loss(*a):
        return loss(jax.tree.unflatten(treedef, a[:n]), jax.tree.unflatten(bdef, a[n:]))
    structs = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in flat] + \
        [jax.ShapeDtypeStruct(x.shape if one else (rows,) + tuple(x.shape[1:]), x.dtype)
         for x, one in zip(blv, shared_leaves(batch))]
    try:
        closed = jax.make_jaxpr(flat_loss)(*structs)
    except Exception as e:  # the user's code may raise anything while tracing
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise MlsysError(f"loss_fn(params, batch) failed on a microbatch of {rows} rows: "
                         f"{type(e).__name__}: {msg}") from None
    out = closed.out_avals
    if len(out) != 1 or out[0].shape != () or not jnp.issubdtype(out[0].dtype, jnp.inexact):
        raise MlsysError(f"loss_fn(params, batch) must return a float scalar, got "
                         f"{[str(a) for a in out]}; return the mean of the per-example losses")
    return closed


def _aval(x):
    """A leaf's abstract value (a ShapeDtypeStruct's too: plans are made on shapes)."""
    if isinstance(x, jax.ShapeDtypeStruct):
        return jax.core.ShapedArray(x.shape, x.dtype)
    return jax.typeof(jnp.asarray(x))


def plan_pipeline(loss_fn: Callable, params, batch, optimizer, mesh_shape: dict,
                  microbatches: int, *, schedule: str = "1f1b", split=None, remat: bool = False,
                  hw: str = "cpu") -> PipelinePlan:
    """Check a user's step and decide its pipeline (see the module docstring)."""
    if not isinstance(optimizer, optax.GradientTransformation):
        raise MlsysError(f"optimizer: expected an optax GradientTransformation (e.g. "
                         f"optax.adamw(1e-3)), got {type(optimizer).__name__}")
    shape = check_mesh(mesh_shape)
    stages, data = shape[PIPE], shape.get(DATA, 1)
    rows = check_counts(batch, data, stages, microbatches, schedule)
    trainable, rest = split_params(params)
    if not jax.tree.leaves(trainable):
        raise MlsysError(f"params: no float arrays to train in {type(params).__name__}")
    loss = lambda t, b: loss_fn(combine(t, rest), b)
    closed = trace_microbatch(loss, trainable, batch, rows)
    path_leaves, treedef = jax.tree_util.tree_flatten_with_path(trainable)
    paths = [p for p, _ in path_leaves]
    n = len(paths)
    units = find_units(closed, n, paths, stages)
    check_stage_count(units, stages)
    given = split is not None
    costs = [] if given else unit_costs(closed, n, units, hw)
    stage_of_unit = at_split_points(units, split, stages) if given else balanced(costs, stages)
    cut = build_split(closed, n, units, stage_of_unit)
    leaves = StageLeaves([_aval(x) for _, x in path_leaves], cut.placements, stages)
    popt = PartitionedOptimizer(optimizer, treedef, leaves)
    sched = make_schedule(schedule, stages, microbatches)
    mesh = make_mesh(shape)
    program = PipelineProgram(cut, leaves, popt, sched, mesh, remat,
                              shared=shared_leaves(batch))
    times = [estimated_time_us(cut, s, hw) for s in range(stages)]
    off = off_switch(loss_fn) if draws_random(closed) else None
    replan = None if off is None else partial(
        plan_pipeline, off, params, batch, optimizer, mesh_shape, microbatches,
        schedule=schedule, split=split, remat=remat, hw=hw)
    return PipelinePlan(loss, trainable, treedef, paths, batch, optimizer, shape, sched, remat,
                        units, stage_of_unit, cut, leaves, popt, program, costs, times, hw, given,
                        dropout_off=replan, source=(loss_fn, rest))
