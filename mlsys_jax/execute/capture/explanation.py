"""``explain(fn, *args)``: what capture does with a call, like ``torch._dynamo.explain``.

It runs the call cold (as a first call would) and reports the graphs, the breaks with their
source lines, each graph's ops, how graphs are compiled (``notes``), what the recording depends
on outside its arguments (``guards``), the guards that failed and made calls record again
(``guard_failures``), and why calls with these arguments run eagerly (``fallback``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax

from mlsys_jax.execute.capture.captured import Captured, argument_tree, input_key
from mlsys_jax.execute.capture.exact_programs import MAX_PROGRAM_OPS
from mlsys_jax.execute.capture.guard_tree import Root

MAX_SHOWN = 10  # guards and failures shown by str(); the lists hold them all


@dataclass
class ExplainOutput:
    """Like ``torch._dynamo.explain``: graphs, breaks (with source lines), each graph's ops.

    ``fallback`` says why calls with these arguments run eagerly (None when they are captured);
    ``notes`` say how graphs are compiled where it differs from one program per graph.
    """

    graph_count: int
    graph_break_count: int
    break_reasons: list
    ops_per_graph: list
    graphs: list
    out: Any = None
    fallback: str | None = None
    notes: list = field(default_factory=list)
    guards: list = field(default_factory=list)  # what was read outside, and where
    guard_failures: list = field(default_factory=list)  # why earlier calls recorded again
    side_effects: list = field(default_factory=list)  # this run's (the path is not replayed)

    def __str__(self):
        lines = [f"graphs: {self.graph_count}, breaks: {self.graph_break_count}"]
        lines += [f"  graph {i + 1}: {ops}" for i, ops in enumerate(self.ops_per_graph)]
        lines += [f"  break {i + 1}: {b.reason} at {b.source}" for i, b in enumerate(self.break_reasons)]
        lines += [f"  note: {n}" for n in self.notes]
        lines += [f"  guard: {g}" for g in self.guards[:MAX_SHOWN]]
        if len(self.guards) > MAX_SHOWN:
            lines.append(f"  ... and {len(self.guards) - MAX_SHOWN} more guards")
        lines += [f"  recorded again: {f}" for f in self.guard_failures[-MAX_SHOWN:]]
        lines += [f"  side effect (not replayed): {s}" for s in self.side_effects[:MAX_SHOWN]]
        if self.fallback:
            lines.append(f"  runs eagerly: {self.fallback}")
        return "\n".join(lines)


def _op_names(closed) -> list[str]:
    from mlsys_jax.compat import Literal
    from mlsys_jax.ir.opview import op_view

    # Constants are parameters of a segment; an op on constants only (the convert of a Python
    # scalar inside a jnp helper) is not the user's op.
    consts = set(closed.jaxpr.constvars)
    for eqn in closed.jaxpr.eqns:
        if all(isinstance(v, Literal) or v in consts for v in eqn.invars):
            consts.update(eqn.outvars)
    # torch.sum is Dynamo's name for what JAX records as reduce_sum
    return [{"reduce_sum": "sum"}.get(op.name, op.name) for op in op_view(closed)
            if not all(isinstance(v, Literal) or v in consts for v in op.invars)]


def _notes(segments) -> list[str]:
    notes = []
    for i, seg in enumerate(segments, start=1):
        for unit in seg.units:
            notes.append(f"graph {i}: {unit} runs as its own XLA program, as eager runs it (XLA "
                         "fuses inside it, which exact replay keeps)")
        size = sum(e.traits.size for e in seg.eqns if not e.traits.unit)
        if size > MAX_PROGRAM_OPS:
            notes.append(f"graph {i}: {size} primitives compiled as "
                         f"{len(seg.pieces) - len(seg.units)} programs of at most "
                         f"{MAX_PROGRAM_OPS} (compile time stays linear in the graph's length)")
    return notes


def explain(fn: Callable, *args, **kwargs) -> ExplainOutput:
    """Capture ``fn`` on these arguments (a cold run) and report its graphs and breaks.

    On a :class:`Captured` function the run fills its guard tree as a call would (after checking
    the tree's guards, as a call does), and ``fallback`` says if (and why) calls with these
    arguments run eagerly.
    """
    c = fn if isinstance(fn, Captured) else Captured(fn)
    leaves, key = input_key(args, kwargs)
    root = c.root_for(key, leaves)
    fallback = c.eager_reason(key) if root is None else root.eager_reason
    if fallback:  # a tree of its own: the report only, calls stay eager
        root = Root(all_arrays=all(isinstance(x, jax.Array) for x in leaves))
    out, run = c.run_cold(root, leaves, argument_tree(args, kwargs), (args, kwargs))
    graphs = [seg.jaxpr() for seg in run.segments]
    guards = [f"{g.what} (read at {g.where})" for g in root.guards.values()]
    return ExplainOutput(len(graphs), len(run.breaks), list(run.breaks),
                         [_op_names(g) for g in graphs], graphs, out,
                         fallback or root.eager_reason or run.overflow, _notes(run.segments),
                         guards, list(c.failures.get(key, ())), list(run.effects))
