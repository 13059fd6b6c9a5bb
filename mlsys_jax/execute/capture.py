"""Graph-break capture: ``capture(fn)`` and ``explain(fn, *args)`` (lecture §8.4, exercise 8).

``capture(fn)`` runs ``fn``'s Python on deferred values (``_record.py``) and collects JAX
primitives into a graph *segment*. Where Python needs a concrete value — ``bool`` (an ``if`` or
``while``), ``int``/``__index__``, ``float``, ``item``/``tolist``/``np.asarray``, or printing — the
graph breaks: the segment so far is compiled with ``jax.jit`` and run, Python gets the value, and
recording continues in a new segment. Like ``torch._dynamo.explain``, :func:`explain` reports the
graphs, the breaks (what needed a value, and the source line) and each graph's ops.

Guarded replay. Compiled segments are kept in a tree keyed by the inputs' shapes, dtypes and
weak types (plus the values of non-array arguments) and, after each break, by the concrete value
Python branched on. A warm call walks that tree — run segment, read the guard value, pick the
child — without running ``fn``'s Python or retracing. Once both outcomes of a ``bool`` break
are known and each returns after one segment, the break and its two branches replay as one
``lax.cond`` program (``_fuse.py``): one dispatch, no guard read on the host. This is sound for *pure* functions (the
output depends only on the arguments), the same assumption ``jax.jit`` makes: a global that
changes between calls, a counter, or Python-side I/O is not seen by a warm call. What capture can
detect it refuses with :class:`~mlsys_jax.errors.MlsysError`: a deferred value stored outside the
function (it escapes the call), JAX primitives with effects other than debug printing, a function
that records different operations on the same inputs and guard values. Printing a deferred value
is a break whose *text* Python consumes, so a path containing one is never replayed: such calls
re-run the Python (reusing the compiled segments), and the print happens every time, as eager.

Results equal eager JAX bitwise (tests/test_capture.py): each segment is one compiled XLA program
of the primitives eager dispatch runs one by one, compiled without XLA's fusion pass (fusion
contracts mul+add into FMAs: one rounding instead of eager's two). Known limit: a composite jnp
function that eager runs as one fused executable (``jnp.var``) is recorded primitive by primitive,
and may differ from eager in the last bit. ``exact=False`` lets XLA fuse, as ``jax.jit`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import numpy as np

from mlsys_jax.compat import Tracer, eval_trace, set_current_trace
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute._fuse import fuse_branch, fusable
from mlsys_jax.execute._segments import (CONVERT, TEXT_KINDS, BreakReason, ColdRun, Node,
                                        guard_key)

__all__ = ["BreakReason", "Captured", "ExplainOutput", "capture", "explain"]


def _leaf_key(x):
    if isinstance(x, Tracer):
        raise MlsysError(
            f"capture: got a {type(x).__name__} argument; a captured function takes concrete "
            "arrays. Apply jax.grad/vmap/jit inside the captured function, not around it.")
    if isinstance(x, (jax.Array, np.ndarray)):
        return (x.shape, x.dtype, getattr(x, "weak_type", False))
    try:
        hash(x)
    except TypeError:
        raise MlsysError(f"capture: argument of type {type(x).__name__} is neither an array nor "
                         "a hashable Python value; pass arrays (or hashable static values)") from None
    return ("static", type(x), x)


class Captured:
    """``fn`` with graph-break capture and guarded replay of its compiled segments (see module doc)."""

    def __init__(self, fn: Callable, exact: bool = True):
        if not callable(fn):
            raise MlsysError(f"capture: expected a callable, got {type(fn).__name__}")
        self.fn, self.exact = fn, exact
        self.roots: dict = {}  # input key -> Node
        self.cache: dict = {}  # segment signature -> jitted segment (shared across the tree)
        self.stats = {"cold": 0, "warm": 0, "fused": 0}
        self.fused: dict = {}  # id(break node) -> FusedBranch, or None once it proved unfusable
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
        key = (tree, tuple(map(_leaf_key, leaves)))
        node = self.roots.get(key)
        if node is not None:
            out = self._replay(node, leaves)
            if out is not _MISS:
                self.stats["warm"] += 1
                return out
        return self.run_cold(key, leaves, tree)[0]

    def _replay(self, node, leaves):
        env = dict(enumerate(x for x in leaves if isinstance(x, (jax.Array, np.ndarray))))
        while True:
            out = self._replay_fused(node, env)
            if out is not _MISS:
                return out
            seg = node.seg
            if seg is not None:
                env.update(zip(seg.out_slots, seg.fn(*[env[s] for s in seg.in_slots])))
            if node.final is not None:
                tree, specs = node.final
                return jax.tree_util.tree_unflatten(
                    tree, [env[v] if k == "slot" else v for k, v in specs])
            if node.kind is None or node.kind in TEXT_KINDS:
                return _MISS
            guard = guard_key(node.kind, CONVERT[node.kind](env[node.slot], *node.extra))
            node = node.children.get(guard)
            if node is None:
                return _MISS

    def _replay_fused(self, node, env):
        """Both outcomes of this bool break known: one lax.cond program, no guard read."""
        fused = self.fused.get(id(node), _MISS)
        if fused is _MISS:
            if not fusable(node):
                return _MISS  # not (yet) both outcomes: ask again once the tree grows
            fused = self.fused[id(node)] = fuse_branch(node, self.exact)
        if fused is None:
            return _MISS
        try:
            leaves = fused.fn(*[env[s] for s in fused.in_slots])
        except (TypeError, ValueError):  # branches disagree on types: replay segment by segment
            self.fused[id(node)] = None
            return _MISS
        self.stats["fused"] += 1
        return jax.tree_util.tree_unflatten(fused.out_tree, list(leaves))

    def run_cold(self, key, leaves, tree):
        """Run the Python on deferred values, filling the guard tree; returns (result, run)."""
        self.stats["cold"] += 1
        run = ColdRun(self.cache, self.roots.setdefault(key, Node()), self.exact)
        vals = [run.input(x) if isinstance(x, (jax.Array, np.ndarray)) else x for x in leaves]
        args, kwargs = jax.tree_util.tree_unflatten(tree, vals)
        del vals
        with set_current_trace(run.trace):
            out = self.fn(*args, **kwargs)
        del args, kwargs
        with set_current_trace(eval_trace):
            result = run.finish(out)
        del out
        run.check_escapes()
        return result, run


_MISS = object()


def capture(fn: Callable, exact: bool = True) -> Captured:
    """Wrap ``fn`` for graph-break capture; ``capture(fn)(*args)`` equals ``fn(*args)``.

    ``exact=True`` (default) keeps eager's rounding: XLA does not fuse the recorded primitives (a
    ``mul`` feeding an ``add`` would become one FMA), so each rounds as eager dispatch rounds it.
    ``exact=False`` lets XLA fuse each segment like ``jax.jit`` — faster for long elementwise
    chains (on the branchy benchmark function the difference was within 0–18%), equal to eager
    only up to rounding.

    Example::

        f = capture(lambda x, w: jnp.exp(x @ w) if (x @ w).sum() > 0 else x @ w)
        f(x, w)   # cold: runs the Python, 2 graphs, 1 break
        f(x, w)   # warm: replays the cached segments, Python not run
    """
    return Captured(fn, exact)


@dataclass
class ExplainOutput:
    """Like ``torch._dynamo.explain``: graphs, breaks (with source lines), each graph's ops."""

    graph_count: int
    graph_break_count: int
    break_reasons: list
    ops_per_graph: list
    graphs: list
    out: Any = None

    def __str__(self):
        lines = [f"graphs: {self.graph_count}, breaks: {self.graph_break_count}"]
        lines += [f"  graph {i + 1}: {ops}" for i, ops in enumerate(self.ops_per_graph)]
        lines += [f"  break {i + 1}: {b.reason} at {b.source}" for i, b in enumerate(self.break_reasons)]
        return "\n".join(lines)


def _op_names(closed) -> list[str]:
    from mlsys_jax.ir.opview import op_view

    # torch.sum is Dynamo's name for what JAX records as reduce_sum
    return [{"reduce_sum": "sum"}.get(op.name, op.name) for op in op_view(closed)]


def explain(fn: Callable, *args, **kwargs) -> ExplainOutput:
    """Capture ``fn`` on these arguments (a fresh, cold capture) and report its graphs and breaks."""
    c = fn if isinstance(fn, Captured) else Captured(fn)
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    out, run = c.run_cold((tree, tuple(map(_leaf_key, leaves))), leaves, tree)
    graphs = [seg.jaxpr() for seg in run.segments]
    return ExplainOutput(len(graphs), len(run.breaks), list(run.breaks),
                         [_op_names(g) for g in graphs], graphs, out)
