"""The graph executor: TensorFlow's ``session.run(fetches, feed)`` on a jaxpr (lecture §2.3, §8.1).

``run(graph, fetches, feed)`` executes only the equations the fetched values depend on (partial
execution: an auxiliary output that is not fetched costs nothing), one equation at a time, and frees
each intermediate when its last user has run (reference counts). It returns the values and what it
did: ops launched (the op view — a named call such as ``relu`` or ``softmax_xent`` is one op),
equations and primitives executed, and the peak of live bytes. The peak follows the convention of
:func:`mlsys_jax.cost.liveness`, so on the same (pruned) graph the two figures are equal.

Graph mode AD (§3.3, TensorFlow): :func:`grad_graph` makes the gradient a graph — the jaxpr of
``jax.value_and_grad`` of the forward — which this executor runs like any other graph.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, DropVar, Literal, ShapedArray, Var, bind_equation
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir import aval_bytes, op_view, trace_tree
from mlsys_jax.ir.walk import walk_eqn


@dataclass(frozen=True)
class Graph:
    """A ClosedJaxpr whose inputs (TF placeholders) and outputs (fetchable values) have names."""

    closed: ClosedJaxpr
    input_names: tuple
    output_names: tuple

    @property
    def jaxpr(self):
        """The open jaxpr whose equations the executor runs."""
        return self.closed.jaxpr


@dataclass(frozen=True)
class ExecStats:
    """What one :func:`run` did."""

    ops_executed: int
    op_names: tuple
    equations_executed: int
    primitives_executed: int
    peak_bytes: int
    freed: int  # intermediates released by reference count before the run ended


@dataclass(frozen=True)
class Fetched:
    """Fetched values (in fetch order, and by name) and the execution statistics."""

    values: list
    by_name: dict
    stats: ExecStats


def _path_name(prefix: str, path) -> str:
    parts = [prefix] if prefix else []
    for k in path:
        key = getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))
        parts.append(str(key))
    return "/".join(parts) or "out"


def make_graph(fn: Callable, *args, arg_names: Sequence[str] | None = None) -> Graph:
    """Trace ``fn(*args)`` into a :class:`Graph`; inputs are named by argument name and pytree
    path (``params/W1``, ``x``), outputs by pytree path (a dict output ``{'loss', 'aux'}`` gives
    ``loss`` and ``aux``; a single output is ``out``)."""
    traced = trace_tree(fn, *args)
    if arg_names is None:
        try:
            arg_names = [p.name for p in inspect.signature(fn).parameters.values()
                         if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            arg_names = []
    arg_names = list(arg_names)[:len(args)]
    arg_names += [f"arg{i}" for i in range(len(arg_names), len(args))]
    in_names = []
    for i, a in enumerate(args):
        for path, _ in jax.tree_util.tree_flatten_with_path(a)[0]:
            in_names.append(_path_name(arg_names[i], path))
    out_struct = jax.tree_util.tree_unflatten(traced.out_tree, [0] * traced.out_tree.num_leaves)
    out_names = [_path_name("", p) for p, _ in jax.tree_util.tree_flatten_with_path(out_struct)[0]]
    return Graph(traced.closed, tuple(in_names), tuple(out_names))


def grad_graph(loss_fn: Callable, *args, argnums=0) -> Graph:
    """Graph mode AD: the graph of ``jax.value_and_grad(loss_fn)`` — outputs ``loss``, ``grad/...``."""
    vg = jax.value_and_grad(loss_fn, argnums=argnums)

    def loss_and_grad(*a):
        loss, grads = vg(*a)
        return {"loss": loss, "grad": grads}

    return make_graph(loss_and_grad, *args, arg_names=list(inspect.signature(loss_fn).parameters))


def as_graph(graph) -> Graph:
    """Accept a Graph or a bare ClosedJaxpr (named ``in0..``/``out0..``); refuse anything else."""
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, ClosedJaxpr):
        return Graph(graph, tuple(f"in{i}" for i in range(len(graph.jaxpr.invars))),
                     tuple(f"out{i}" for i in range(len(graph.jaxpr.outvars))))
    raise MlsysError(f"execute.run: expected a Graph (make_graph) or a ClosedJaxpr, got "
                     f"{type(graph).__name__}")


def _resolve_fetch(g: Graph, f) -> Any:
    if isinstance(f, str):
        if f in g.output_names:
            return g.jaxpr.outvars[g.output_names.index(f)]
        raise MlsysError(f"execute.run: fetch {f!r} is not a value of this graph; its outputs are "
                         f"{', '.join(g.output_names)}. Fetch one of those (or an equation's Var).")
    if isinstance(f, int) and not isinstance(f, bool) and 0 <= f < len(g.jaxpr.outvars):
        return g.jaxpr.outvars[f]
    produced = {v for e in g.jaxpr.eqns for v in e.outvars}
    if isinstance(f, Var) and (f in produced or f in g.jaxpr.invars or f in g.jaxpr.constvars):
        return f
    raise MlsysError(f"execute.run: fetch {f!r} is not in the graph; fetch an output name "
                     f"({', '.join(g.output_names)}), an output index, or a Var of its equations.")


def needed_equations(jaxpr, fetch_vars) -> list[int]:
    """Indices of the equations the fetched values depend on (TF's partial execution).

    Effectful equations (debug prints, callbacks) always run: JAX never drops an effect."""
    need = {v for v in fetch_vars if isinstance(v, Var)}
    keep = []
    for i in reversed(range(len(jaxpr.eqns))):
        eqn = jaxpr.eqns[i]
        if eqn.effects or any(v in need for v in eqn.outvars):
            keep.append(i)
            need.update(v for v in eqn.invars if isinstance(v, Var))
    return keep[::-1]


def _check_feed(g: Graph, feed, needed_inputs) -> dict:
    if isinstance(feed, Mapping):
        unknown = [k for k in feed if k not in g.input_names]
        if unknown:
            raise MlsysError(f"execute.run: feed names {unknown} are not inputs of the graph; its "
                             f"inputs are {', '.join(g.input_names)}")
        by_var = {g.jaxpr.invars[g.input_names.index(k)]: v for k, v in feed.items()}
    else:
        feed = list(feed)
        if len(feed) != len(g.jaxpr.invars):
            raise MlsysError(f"execute.run: feed has {len(feed)} values, the graph has "
                             f"{len(g.jaxpr.invars)} inputs ({', '.join(g.input_names)})")
        by_var = dict(zip(g.jaxpr.invars, feed))
    for var in needed_inputs:
        name = g.input_names[g.jaxpr.invars.index(var)]
        if var not in by_var:
            raise MlsysError(f"execute.run: the fetched values need input {name!r} "
                             f"({var.aval.str_short()}), which was not fed. Add it to feed.")
        val = by_var[var]
        shape, dtype = np.shape(val), getattr(val, "dtype", np.asarray(val).dtype)
        if tuple(shape) != tuple(var.aval.shape) or np.dtype(dtype) != np.dtype(var.aval.dtype):
            raise MlsysError(
                f"execute.run: input {name!r} expects {var.aval.str_short(short_dtypes=True)}, got "
                f"{ShapedArray(tuple(shape), np.dtype(dtype)).str_short(short_dtypes=True)}. "
                "Feed an array of that shape and dtype "
                "(or re-trace the graph for the new one).")
    return by_var


def run(graph, fetches: Sequence, feed) -> Fetched:
    """Execute only what ``fetches`` need, op by op, freeing values at their last use.

    Args:
      graph: a :class:`Graph` (from :func:`make_graph`/:func:`grad_graph`) or a ClosedJaxpr
        (inputs ``in0..``, outputs ``out0..``).
      fetches: output names, output indices, or Vars of the graph's equations.
      feed: ``{input name: array}`` (only the inputs the fetches need), or a list of all inputs.
    """
    g = as_graph(graph)
    jaxpr = g.jaxpr
    fetches = [fetches] if isinstance(fetches, (str, int, Var)) else list(fetches)
    fetch_vars = [_resolve_fetch(g, f) for f in fetches]
    keep = needed_equations(jaxpr, fetch_vars)
    refs: dict = {}
    for i in keep:
        for v in dict.fromkeys(v for v in jaxpr.eqns[i].invars if isinstance(v, Var)):
            refs[v] = refs.get(v, 0) + 1
    for v in fetch_vars:
        refs[v] = refs.get(v, 0) + 1  # fetched values stay live to the end
    needed_inputs = [v for v in jaxpr.invars if v in refs]
    by_var = _check_feed(g, feed, needed_inputs)
    env = {v: c for v, c in zip(jaxpr.constvars, g.closed.consts) if v in refs}
    env.update({v: by_var[v] for v in needed_inputs})
    size = {v: aval_bytes(v.aval) for v in env}
    live = peak = sum(size.values())
    read = lambda v: v.val if isinstance(v, Literal) else env[v]  # noqa: E731
    freed = n_prims = 0
    for i in keep:
        eqn = jaxpr.eqns[i]
        outs = bind_equation(eqn, [read(v) for v in eqn.invars])
        n_prims += sum(1 for _ in walk_eqn(eqn))
        for v, val in zip(eqn.outvars, outs):
            if not isinstance(v, DropVar):
                env[v], size[v] = val, aval_bytes(v.aval)
                live += size[v]
        peak = max(peak, live)
        released = list(dict.fromkeys(v for v in eqn.invars if isinstance(v, Var)))
        for v in released:
            refs[v] -= 1
        for v in released + [v for v in eqn.outvars if not isinstance(v, DropVar)]:
            if refs.get(v, 0) == 0 and v in env:  # last user has run (or nobody uses it)
                del env[v]
                live -= size[v]
                freed += 1
    kept = {id(jaxpr.eqns[i]) for i in keep}
    op_names = tuple(op.name for op in op_view(g.closed) if any(id(e) in kept for e in op.eqns))
    values = [read(v) for v in fetch_vars]
    names = [f if isinstance(f, str) else str(f) for f in fetches]
    stats = ExecStats(len(op_names), op_names, len(keep), n_prims, int(peak), freed)
    return Fetched(values, dict(zip(names, values)), stats)

