"""A plan applied to a user's loss: its segments as pinned ``custom_vjp``s (lecture §7.2).

``apply`` evaluates the loss's jaxpr segment by segment. A segment without recomputation is plain
JAX code (JAX keeps its residuals, as without remat). A segment with recomputation is one
``custom_vjp``: its forward linearizes each equation (``jax.vjp``) and keeps only the plan's saved
values and JVP intermediates; its backward re-runs the plan's recomputed equations — pinned by
``xla_remat.pinned`` so XLA neither merges them with the forward nor runs them early (the plan's
``pin`` says whether the pullbacks run inside the pin too) — then runs each equation's pullback
in reverse order. A plan without recomputation returns the user's function.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from mlsys_jax.compat import DropVar, Literal, bind_equation
from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.milp import Plan
from mlsys_jax.remat.planner.flat import flatten_loss
from mlsys_jax.remat.planner.graph import LossGraph, loss_graph
from mlsys_jax.remat.xla_remat import pinned


class _Segment:
    """Equations ``[start, end)`` of the loss as a custom_vjp that recomputes per the plan."""

    def __init__(self, graph: LossGraph, start, end, ins, outs, *, saved, saved_tmp, recompute,
                 pin: str):
        self.graph, self.ins, self.outs, self.pin = graph, ins, outs, pin
        self.eqns = list(enumerate(graph.closed.jaxpr.eqns))[start:end]
        self.saved, self.saved_tmp, self.recompute = saved, saved_tmp, recompute
        self.recomputed = [i for i, _ in self.eqns if i in recompute]
        self.call = jax.custom_vjp(self._plain)
        self.call.defvjp(self._forward, self._backward)

    def _env(self, ins):
        jaxpr = self.graph.closed.jaxpr
        env = dict(zip(jaxpr.constvars, self.graph.closed.consts))
        env.update(zip(self.ins, ins))
        return env

    def _step(self, i, eqn, env, residuals):
        invals = [self.graph.read(env, v) for v in eqn.invars]
        info = self.graph.vjps[i]
        if info is None:
            outs = bind_equation(eqn, invals)
        else:
            outs, residuals[i] = info.linearize(eqn, invals)
        env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, DropVar))

    def _plain(self, *ins):
        env = self._env(ins)
        self.graph.run([e for _, e in self.eqns], env)
        return tuple(env[v] for v in self.outs)

    def _forward(self, *ins):
        env, residuals = self._env(ins), {}
        for i, eqn in self.eqns:
            self._step(i, eqn, env, residuals)
        tmp = [self._tmp_leaves(i, residuals[i]) for i in self.saved_tmp]
        res = (list(ins), [env[v] for v in self.saved], tmp)
        return tuple(env[v] for v in self.outs), res

    def _tmp_leaves(self, i, leaves):
        kinds = self.graph.vjps[i].leaves
        return [x for x, (kind, _) in zip(leaves, kinds) if kind == "tmp"]

    def _residual_leaves(self, i, eqn, env, residuals, tmp):
        """The leaves of equation ``i``'s pullback: linearized here, or saved and recomputed."""
        if i in residuals:
            return residuals[i]
        info = self.graph.vjps[i]
        return [self.graph.read(env, eqn.invars[j]) if kind == "in" else
                env[eqn.outvars[j]] if kind == "out" else tmp[i][j] for kind, j in info.leaves]

    def _recompute(self, res, ct):
        """The plan's recomputed values (run inside the pin)."""
        ins, saved, _ = res
        env = self._env(ins)
        env.update(zip(self.saved, saved))
        jaxpr = self.graph.closed.jaxpr
        self.graph.run([jaxpr.eqns[i] for i in self.recomputed], env)
        return [[env[v] for v in jaxpr.eqns[i].outvars if not isinstance(v, DropVar)]
                for i in self.recomputed]

    def _backward(self, res, ct):
        """What the plan's ``pin`` says runs inside ``xla_remat.pinned``: only the recomputation
        (the pullbacks then run outside the conditional, where XLA fuses them into the rest of
        the backward as for plain ``jax.grad``: the faster of the two), or the segment's whole
        backward (its linearization too, so residuals exist only while the segment's backward
        runs: the fewer temp bytes at tight budgets). ``Frontier`` compiles both where either
        may win and keeps the Pareto points; docs/remat.md has the measurements."""
        if self.pin == "backward":
            return pinned(lambda r, c: self._backward_from(r, c, self._recompute(r, c)), res, ct)
        return self._backward_from(res, ct, pinned(self._recompute, res, ct))

    def _backward_from(self, res, ct, outs):
        ins, saved, tmp_leaves = res
        env, residuals = self._env(ins), {}
        env.update(zip(self.saved, saved))
        jaxpr = self.graph.closed.jaxpr
        for i, vals in zip(self.recomputed, outs):
            eqn = jaxpr.eqns[i]
            env.update(zip([v for v in eqn.outvars if not isinstance(v, DropVar)], vals))
            info = self.graph.vjps[i]
            if info is not None:
                invals = [self.graph.read(env, v) for v in eqn.invars]
                residuals[i] = info.linearize(eqn, invals)[1]
        tmp = dict(zip(self.saved_tmp, tmp_leaves))
        cts = {v: c for v, c in zip(self.outs, ct) if jnp.issubdtype(c.dtype, jnp.inexact)}
        for i, eqn in reversed(self.eqns):
            info = self.graph.vjps[i]
            if info is None or not any(v in cts for v in eqn.outvars):
                continue
            back = info.pull(eqn, self._residual_leaves(i, eqn, env, residuals, tmp), cts)
            for j, c in zip(info.active, back):
                w = eqn.invars[j]
                cts[w] = cts[w] + c if w in cts else c
        return tuple(cts.get(v) if jnp.issubdtype(v.aval.dtype, jnp.inexact) else None
                     for v in self.ins)


def check_plan(graph: LossGraph, the_plan) -> None:
    if not isinstance(the_plan, Plan):
        raise MlsysError(f"apply: expected a Plan from remat.plan, got {type(the_plan).__name__}")
    if the_plan.n_values != graph.n_values or the_plan.segments[-1] >= max(graph.n_eqns, 1) \
            or not set(the_plan.recomputed) <= set(graph.names):
        raise MlsysError(f"apply: the plan was made for another function ({the_plan.n_values} "
                         f"values; this loss has {graph.n_values}); plan this loss first")


def _scan_bodies_applied(graph: LossGraph, policy: str):
    """The loss with every eligible scan body checkpointed under ``policy``."""
    from mlsys_jax.remat.planner.scan_bodies import evaluate

    closed = graph.closed

    def run(diff, batch):
        return evaluate(closed.jaxpr, closed.consts, [*diff, *batch], policy)[0]
    return run


def flat_applied(graph: LossGraph, the_plan: Plan):
    """``fn(diff, batch_leaves)``: the loss with the plan's segments, saves and recomputation."""
    check_plan(graph, the_plan)
    if the_plan.scan_policy is not None:
        return _scan_bodies_applied(graph, the_plan.scan_policy)
    jaxpr = graph.closed.jaxpr
    eqns = jaxpr.eqns
    last_read = {}
    for i, eqn in enumerate(eqns):
        last_read.update({v: i for v in eqn.invars if not isinstance(v, Literal)})
    last_read.update({v: len(eqns) for v in jaxpr.outvars if not isinstance(v, Literal)})
    var = {k: v for v, k in graph.value_of.items()}
    index = {n: k for k, n in enumerate(graph.names)}
    saved = {var[index[n]] for n in the_plan.saved if n in index}
    saved_tmp = {int(n[:-len(".jvp")].rsplit("_", 1)[1]) for n in the_plan.saved
                 if n.endswith(".jvp")}
    recompute = {int(graph.eqn_of[index[n]]) for n in the_plan.recomputed}
    consts = set(jaxpr.constvars)
    parts = []
    for start, end in zip(the_plan.segments, list(the_plan.segments[1:]) + [len(eqns)]):
        if not recompute & set(range(start, end)):
            parts.append((eqns[start:end], None))
            continue
        made = {v for e in eqns[start:end] for v in e.outvars if not isinstance(v, DropVar)}
        ins = list(dict.fromkeys(v for e in eqns[start:end] for v in e.invars
                                 if not isinstance(v, Literal) and v not in made
                                 and v not in consts))
        outs = [v for e in eqns[start:end] for v in e.outvars
                if not isinstance(v, DropVar) and last_read.get(v, -1) >= end]
        parts.append((eqns[start:end], _Segment(
            graph, start, end, ins, outs,
            saved=[v for e in eqns[start:end] for v in e.outvars if v in saved],
            saved_tmp=sorted(i for i in saved_tmp if start <= i < end), recompute=recompute,
            pin=the_plan.pin)))

    def run(diff, batch):
        env = graph.start_env(diff, batch)
        for seg_eqns, seg in parts:
            if seg is None:
                graph.run(seg_eqns, env)
            else:
                env.update(zip(seg.outs, seg.call(*[env[v] for v in seg.ins])))
        return graph.read(env, jaxpr.outvars[0])
    return run


def apply(loss_fn, the_plan: Plan, params, batch):
    """``loss_fn`` (same signature) whose gradient saves and recomputes as ``the_plan`` says."""
    flat = flatten_loss(loss_fn, params, batch, "apply")
    graph = loss_graph(flat)
    check_plan(graph, the_plan)
    if not the_plan.recomputed:
        return loss_fn                  # nothing recomputed: the user's own function, bit for bit
    run = flat_applied(graph, the_plan)

    def applied(params, batch):
        return run(*flat.split(params, batch))
    return applied
