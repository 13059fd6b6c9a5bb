"""One SPMD training step for a user's heterogeneous stages: the schedule, then the optimizer.

The lecture's executor (``lecture.pipeline.run_schedule``) runs identical stages; a user's stages
differ in parameters and in the shapes they hand on. Every device still runs one program under
``shard_map`` over ``[data,] pipe``: a ``lax.scan`` over the schedule's steps reads the device's
column of the lecture's action table (``schedules.action_arrays``: what to do, which
microbatch, which buffer row) and ``lax.switch``-es on the branch *idle*, *forward of stage s*
or *backward of stage s* — each stage's own code, its own layouts, so a device only ever takes
its stage's branches. Heterogeneous data lives in flat buffers padded to the largest stage
(``flat.py``): parameters and gradients (``placement.py``), the stashed activations, cotangents
and residuals (a row per in-flight microbatch, as many rows as the table needs).

Messages go point to point, one ``ppermute`` per boundary and direction, each inside a
``lax.cond`` on whether that boundary sends at this step (the same for every device), carrying
exactly the boundary's values — an idle stage sends nothing. Counters of the sends that ran and
of idle steps, and the log of each device's actions, come out of the program: the figures are
what ran. After the schedule, gradients are averaged over ``data``, replicated leaves' summed
over ``pipe``, and the optimizer runs per stage (``optim.py``).

The forward saves the vjp's residuals (``stagefn.Residuals``); with ``remat`` it keeps only the
stage's inputs and the backward recomputes the stage's forward.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from mlsys_jax.parallel.pipe import flat
from mlsys_jax.parallel.pipe.branches import stage_switch
from mlsys_jax.parallel.pipe.flat import FlatLayout, padded_family
from mlsys_jax.parallel.pipe.optim import PartitionedOptimizer
from mlsys_jax.parallel.pipe.placement import StageLeaves
from mlsys_jax.parallel.pipe.split import Split
from mlsys_jax.parallel.pipe.stagefn import (differentiable, forward_with_vjp, rebuild_vjp,
                                             residuals_of, stage_io)
from mlsys_jax.parallel.schedules import (BACKWARD, BACKWARD_LOSS, COLUMNS, FORWARD, IDLE,
                                          PipelineSchedule, action_arrays, buffer_rows, write_row)


def send_arrays(columns: dict) -> tuple[np.ndarray, np.ndarray]:
    """``[steps, stages - 1]`` flags: boundary k sends forward (stage k forwards) / backward
    (stage k + 1 backwards) at step t."""
    op = columns["op"]
    fwd = (op[:, :-1] == FORWARD).astype(np.int32)
    bwd = np.isin(op[:, 1:], (BACKWARD, BACKWARD_LOSS)).astype(np.int32)
    return fwd, bwd


class PipelineProgram:
    """The compiled-on-demand step for a split, a schedule and a mesh."""

    def __init__(self, split: Split, leaves: StageLeaves, optimizer: PartitionedOptimizer,
                 schedule: PipelineSchedule, mesh, remat: bool = False, shared: tuple = ()):
        self.split, self.leaves, self.optimizer = split, leaves, optimizer
        self.shared = tuple(shared)   # per batch leaf: one PRNG key every microbatch reads whole
        self.schedule, self.mesh, self.remat = schedule, mesh, remat
        self.stages, self.microbatches = schedule.stages, schedule.microbatches
        self.data = "data" in mesh.axis_names
        self.io = [stage_io(split, s) for s in range(self.stages)]
        bounds = [[split.avals[v] for v in b] for b in split.boundaries]
        self.msg = padded_family([FlatLayout(b) for b in bounds]) if bounds else []
        self.cot = padded_family([FlatLayout([a for a in b if jnp.issubdtype(a.dtype, jnp.inexact)])
                                  for b in bounds]) if bounds else []
        self.res = None if remat else [residuals_of(split, s, io) for s, io in enumerate(self.io)]
        self.res_layouts = None if remat else padded_family(
            [FlatLayout(r.saved_avals) for r in self.res])
        self.columns = action_arrays(schedule)
        self.rows = buffer_rows(self.columns)
        self.fwd_active, self.bwd_active = send_arrays(self.columns)
        self._jitted = None

    # -- per device ---------------------------------------------------------------------------
    def _branches(self):
        """Per branch ``f(stash_row, cot_row, res_row, mb, gown, grep, loss, own, rep, mbatch)
        -> (message, cotangent message, residual row, gown, grep, loss)``: idle, then each
        stage's forward, then each stage's backward."""
        P_, M = self.stages, self.microbatches

        def zeros(layouts):
            return layouts[0].zeros() if layouts else {}

        # every branch takes the step's operands as one tuple (lax.switch passes them alike):
        # (stash_row, cot_row, res_row, mb, gown, grep, loss, own, rep, mbatch)
        def idle(ops):
            gown, grep, loss = ops[4:7]
            return zeros(self.msg), zeros(self.cot), zeros(self.res_layouts), gown, grep, loss

        def inputs(s, stash_row, mb, own, rep, mbatch):
            acts = self.msg[s - 1].unpack(stash_row) if s else []
            batch = [x if one else lax.dynamic_index_in_dim(x, mb, keepdims=False)
                     for x, one in zip(mbatch, self._shared(len(mbatch)))]
            return self.leaves.read(s, self.io[s].leaves, own, rep), acts, batch

        def forward(s):
            io = self.io[s]

            def f(ops):
                stash_row, _, _, mb, gown, grep, loss, own, rep, mbatch = ops
                leaf_vals, acts, batch = inputs(s, stash_row, mb, own, rep, mbatch)
                msg0, cot0, res0 = zeros(self.msg), zeros(self.cot), zeros(self.res_layouts)
                if self.remat:
                    fo, other = differentiable(self.split, s, io, acts, batch)(
                        tuple(leaf_vals), tuple(acts[i] for i in io.float_in))
                    saved = res0
                else:
                    fo, other, res, _ = forward_with_vjp(self.split, s, io, leaf_vals, acts, batch)
                    kinds = self.res[s].kinds
                    saved = self.res_layouts[s].pack([res[i] for i, (k, _) in enumerate(kinds)
                                                      if k == "saved"])
                outs = _merge(io, fo, other)
                if s == P_ - 1:
                    return msg0, cot0, saved, gown, grep, loss + outs[0].astype(loss.dtype) / M
                return self.msg[s].pack(outs), cot0, saved, gown, grep, loss
            return f

        def backward(s):
            io = self.io[s]

            def b(ops):
                stash_row, cot_row, res_row, mb, gown, grep, loss, own, rep, mbatch = ops
                leaf_vals, acts, batch = inputs(s, stash_row, mb, own, rep, mbatch)
                msg0, cot0, res0 = zeros(self.msg), zeros(self.cot), zeros(self.res_layouts)
                if s == P_ - 1:
                    a = io.out_avals[0]
                    cot_out = (jnp.asarray(1.0 / M, a.dtype),)
                else:
                    cot_out = tuple(self.cot[s].unpack(cot_row))
                if self.remat:
                    g = differentiable(self.split, s, io, acts, batch)
                    _, vjp, _ = jax.vjp(g, tuple(leaf_vals),
                                        tuple(acts[i] for i in io.float_in), has_aux=True)
                else:
                    vjp = rebuild_vjp(self.res[s], self.res_layouts[s].unpack(res_row),
                                      leaf_vals, acts, batch, io)
                g_leaves, g_acts = vjp(cot_out)
                dg_own, dg_rep = self.leaves.pack_some(s, dict(zip(io.leaves, g_leaves)))
                back = self.cot[s - 1].pack(list(g_acts)) if s else cot0
                return msg0, back, res0, flat.add(gown, dg_own), flat.add(grep, dg_rep), loss
            return b

        return [idle] + [forward(s) for s in range(P_)] + [backward(s) for s in range(P_)]

    def _shared(self, n: int) -> tuple:
        """Per batch leaf (``n`` of them), whether every microbatch reads it whole."""
        return self.shared or (False,) * n

    def _send(self, k: int, message: dict, layouts, active, pairs):
        """Boundary k's values, sent along ``pairs`` if it sends at this step; zeros otherwise."""
        vals = layouts[k].unpack(message)
        got, ran = lax.cond(active[k] > 0,
                            lambda: (lax.ppermute(vals, "pipe", pairs), jnp.int32(1)),
                            lambda: (jax.tree.map(jnp.zeros_like, vals), jnp.int32(0)))
        return layouts[k].pack(got), ran

    def _body(self, own, rep, state, batch, cols, fwd_active, bwd_active):
        P_, M = self.stages, self.microbatches
        own, rep, state = (jax.tree.map(lambda x: x[0], t) for t in (own, rep, state))
        stage = lax.axis_index("pipe")
        mbatch = [x if one else x.reshape((M, x.shape[0] // M) + x.shape[1:])
                  for x, one in zip(batch, self._shared(len(batch)))]
        branches = self._branches()

        def rows_of(layout):
            return {k: jnp.zeros((self.rows, n), np.dtype(k)) for k, n in layout.sizes.items()}
        carry = (rows_of(self.msg[0]) if self.msg else {}, rows_of(self.cot[0]) if self.cot else {},
                 rows_of(self.res_layouts[0]) if self.res_layouts else {},
                 jax.tree.map(jnp.zeros_like, own), jax.tree.map(jnp.zeros_like, rep),
                 jnp.zeros((), self.io[-1].out_avals[0].dtype), jnp.int32(0),
                 jnp.zeros((2, max(P_ - 1, 1)), jnp.int32))

        def row(buf, r):
            return {k: lax.dynamic_index_in_dim(v, r, keepdims=False) for k, v in buf.items()}

        def write(buf, index_plus_one, value):
            return {k: write_row(buf[k], index_plus_one, value[k]) for k in buf}

        def step(carry, xs):
            stash, cot, res, gown, grep, loss, idle, sends = carry
            (op, mb, slot, recv_act, recv_grad), fa, ba = [c[0] for c in xs[0]], xs[1], xs[2]
            branch = jnp.where(op == IDLE, 0, jnp.where(op == FORWARD, 1 + stage, 1 + P_ + stage))
            msg, back, saved, gown, grep, loss = stage_switch(
                branch, branches, (row(stash, slot), row(cot, slot), row(res, slot), mb,
                                   gown, grep, loss, own, rep, mbatch))
            if res:
                res = write(res, jnp.where(op == FORWARD, slot + 1, 0), saved)
            got_f, got_b = jax.tree.map(jnp.zeros_like, msg), jax.tree.map(jnp.zeros_like, back)
            for k in range(P_ - 1):
                g, ran = self._send(k, msg, self.msg, fa, [(k, k + 1)])
                got_f, sends = flat.add(got_f, g), sends.at[0, k].add(ran)
                if self.cot[k].need:
                    g, ran = self._send(k, back, self.cot, ba, [(k + 1, k)])
                    got_b, sends = flat.add(got_b, g), sends.at[1, k].add(ran)
            if stash:
                stash = write(stash, recv_act, got_f)
            if cot:
                cot = write(cot, recv_grad, got_b)
            carry = (stash, cot, res, gown, grep, loss, idle + (op == IDLE), sends)
            return carry, (op, mb)

        cols_xs = (tuple(cols), fwd_active, bwd_active)
        carry, (log, log_mb) = lax.scan(step, carry, cols_xs)
        _, _, _, gown, grep, loss, idle, sends = carry
        if self.data:
            gown, grep, loss = lax.pmean((gown, grep, loss), "data")
        grep, loss = lax.psum(grep, "pipe"), lax.psum(loss, "pipe")
        new_own, new_rep, new_state = self.optimizer.apply(stage, own, rep, gown, grep, state)
        lead = lambda t: jax.tree.map(lambda x: x[None], t)
        return (lead(new_own), lead(new_rep), lead(new_state), loss, lead(gown), lead(grep),
                idle[None], sends, log[:, None], log_mb[:, None])

    # -- compile and run ----------------------------------------------------------------------
    def jitted(self):
        """The pipeline's SPMD program, built once: the schedule's body under ``shard_map``, jitted."""
        if self._jitted is None:
            pipe, data = P("pipe"), P("data") if self.data else P()
            cols = tuple(P(None, "pipe") for _ in COLUMNS)
            n = len(self.split.closed.jaxpr.invars) - self.split.n_params
            batch = [P() if one else data for one in self._shared(n)]
            fn = jax.shard_map(
                lambda o, r, s, b, c, fa, ba: self._body(o, r, s, b, c, fa, ba),
                mesh=self.mesh, in_specs=(pipe, pipe, pipe, batch, cols, P(), P()),
                out_specs=(pipe, pipe, pipe, P(), pipe, pipe, pipe, P(), P(None, "pipe"),
                           P(None, "pipe")), check_vma=False)
            self._jitted = jax.jit(fn)
        return self._jitted

    def arguments(self, own, rep, state, batch):
        """The program's arguments in order: owned and replicated parameters, optimizer state, the
        batch, the action table's columns and the forward/backward activity masks."""
        fa = self.fwd_active if self.stages > 1 else np.zeros((self.schedule.steps, 1), np.int32)
        ba = self.bwd_active if self.stages > 1 else fa
        return (own, rep, state, list(batch), tuple(self.columns[k] for k in COLUMNS), fa, ba)

    def compile(self, own, rep, state, batch, options=None):
        """Lower and compile the program for these arguments (nothing runs)."""
        return self.jitted().lower(*self.arguments(own, rep, state, batch)).compile(options)


def _merge(io, float_outs, other) -> list:
    """Outputs in the stage's order from its float and other outputs."""
    fo, ot = iter(float_outs), iter(other)
    return [next(fo) if i in io.float_out else next(ot) for i in range(len(io.out_avals))]
