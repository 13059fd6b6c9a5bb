"""Graph-break capture: ``capture(fn)`` and ``explain(fn, *args)`` (lecture §8.4, exercise 8).

``capture(fn)`` runs ``fn``'s Python on deferred values (``recording.py``) and collects JAX
dispatches into a graph *segment*. Where Python needs a concrete value — ``bool`` (an ``if`` or
``while``), ``int``/``__index__``, ``float``, ``item``/``tolist``/``np.asarray``, or printing — the
graph breaks: the segment so far is compiled and run, Python gets the value, and recording
continues in a new segment. Like ``torch._dynamo.explain``, :func:`explain` reports the graphs,
the breaks (what needed a value, and the source line) and each graph's ops.

Guarded replay. Compiled segments are kept in a tree keyed by the inputs' shapes, dtypes and
weak types (plus the values of non-array arguments) and, after each break, by the concrete value
Python branched on, floats by bit pattern (``break_guards.py``). A warm call replays that tree without
running ``fn``'s Python or retracing; from the second warm call on a settled tree, the tree below
a break runs as one program (``one_program.py``): one dispatch, no guard read on the host. This is
sound for *pure* functions (the output depends only on the arguments), the same assumption
``jax.jit`` makes. What capture can detect it refuses with :class:`~mlsys_jax.errors.MlsysError`:
a deferred value stored outside the function, JAX primitives with effects other than debug
printing, a function that records different operations on the same inputs and guard values.
Printing a deferred value is a break whose *text* Python consumes, so a path containing one is
never replayed: such calls re-run the Python (reusing the compiled segments), as eager prints.

Exact mode (default): results equal eager JAX bitwise — values, dtypes and weak types. How the
compiled programs keep eager's rounding (fusion off, barriers between dispatches, constants as
parameters, fused ``jit`` calls run on their own) is measured in ``exact_programs.py``. The cache is
bounded: past ``MAX_SIGNATURES`` input signatures, or a guard that never stabilises
(``guard_tree.py``), calls run eagerly and :func:`explain` says why. ``exact=False`` lets XLA
fuse and simplify each segment like ``jax.jit``: faster, equal to eager up to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable

import jax
import numpy as np

from mlsys_jax.compat import ArrayImpl, Tracer, eval_trace, set_current_trace
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute.capture import one_program
from mlsys_jax.execute.capture.exact_programs import MAX_PROGRAM_OPS
from mlsys_jax.execute.capture.break_guards import CONVERT, TEXT_KINDS, guard_key, value_key
from mlsys_jax.execute.capture.guard_tree import BreakReason, ColdRun, Root

__all__ = ["BreakReason", "Captured", "ExplainOutput", "capture", "explain"]

MAX_SIGNATURES = 32  # input signatures (shapes, dtypes, static values) cached per function
_ARRAYS = (jax.Array, np.ndarray)
_MISS = object()
_JAX_ARRAY = frozenset([ArrayImpl])  # the argument types of a warm call's hot path
_aval = attrgetter("aval")


def _leaf_key(x):
    if isinstance(x, Tracer):
        raise MlsysError(
            f"capture: got a {type(x).__name__} argument; a captured function takes concrete "
            "arrays. Apply jax.grad/vmap/jit inside the captured function, not around it.")
    if isinstance(x, jax.Array):
        return x.aval  # shape, dtype, weak type (cached on the array: the cheapest key)
    if isinstance(x, np.ndarray):
        return ("np", x.shape, x.dtype)
    try:
        hash(x)
    except TypeError:
        raise MlsysError(f"capture: argument of type {type(x).__name__} is neither an array nor "
                         "a hashable Python value; pass arrays (or hashable static values)") from None
    return ("static", type(x), value_key(x))  # floats by bit pattern: -0.0 is not 0.0


def input_key(args, kwargs):
    """(leaves, key): the arguments' leaves and the guard tree's root key for them."""
    if not kwargs:  # the hot path: arrays only, keyed by their cached avals (no tree_flatten)
        for x in args:
            if type(x) is not ArrayImpl:
                break
        else:
            return args, tuple([x.aval for x in args])
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    for x in leaves:
        if type(x) is not ArrayImpl:
            return leaves, (tree, tuple(map(_leaf_key, leaves)))
    return leaves, (tree, tuple([x.aval for x in leaves]))


def _tree(args, kwargs):
    return jax.tree_util.tree_structure((args, kwargs))


def _arrays(leaves):
    return [x for x in leaves if isinstance(x, _ARRAYS)]


class Captured:
    """``fn`` with graph-break capture and guarded replay of its compiled segments (see module doc)."""

    def __init__(self, fn: Callable, exact: bool = True):
        if not callable(fn):
            raise MlsysError(f"capture: expected a callable, got {type(fn).__name__}")
        self.fn, self.exact = fn, exact
        self.roots: dict = {}  # input key -> Root (its guard tree)
        self.cache: dict = {}  # program signature -> jitted program (shared across the tree)
        self.counts = {"cold": 0, "warm": 0, "fused": 0, "eager": 0}  # all but the hot path's
        # input key -> the settled tree's one program as a function of the arguments: a warm
        # call with array arguments runs it with no generic key, lookup or env (cleared by every
        # cold run, the only place a tree grows)
        self.hot: dict = {}
        self.hot_calls = 0  # the hot path's count: one integer, not two dict updates
        self.__wrapped__ = fn

    @property
    def stats(self) -> dict:
        """Calls by kind: ``cold`` (ran the Python), ``warm`` (replayed), ``fused`` (warm, as one
        program), ``eager`` (past a bound)."""
        hot = self.hot_calls
        return {**self.counts, "warm": self.counts["warm"] + hot,
                "fused": self.counts["fused"] + hot}

    def __call__(self, *args, **kwargs):
        if not kwargs and _JAX_ARRAY.issuperset(map(type, args)):
            direct = self.hot.get(tuple(map(_aval, args)))  # input_key's key for these args
            if direct is not None:
                self.hot_calls += 1
                return direct(*args)
        leaves, key = input_key(args, kwargs)
        root = self.roots.get(key)
        if root is not None:
            prog = root.fast  # the whole tree as one program
            if prog is not None:
                out = prog.call(leaves if root.all_arrays else _arrays(leaves))
                if out is not one_program.MISS:
                    self.counts["fused"] += 1
                    self.counts["warm"] += 1
                    if not kwargs and leaves is args:  # every argument a jax array
                        direct = prog.direct(len(args))
                        if direct is not None:
                            self.hot[key] = direct
                    return out
                if root.eager_reason is not None:
                    return self._eager(args, kwargs)
            elif root.eager_reason is not None:
                return self._eager(args, kwargs)
            else:
                out = self._replay(root, leaves)
                if out is not _MISS:
                    return out
        elif len(self.roots) >= MAX_SIGNATURES:
            return self._eager(args, kwargs)
        else:
            root = self.roots[key] = Root(all_arrays=all(isinstance(x, _ARRAYS) for x in leaves))
        return self.run_cold(root, leaves, _tree(args, kwargs))[0]

    def _eager(self, args, kwargs):
        self.counts["eager"] += 1
        with set_current_trace(eval_trace):
            return self.fn(*args, **kwargs)

    def eager_reason(self, key) -> str | None:
        """Why calls with this input key run eagerly (None if they are captured)."""
        root = self.roots.get(key)
        if root is None and len(self.roots) >= MAX_SIGNATURES:
            return (f"more than {MAX_SIGNATURES} different input signatures (shapes, dtypes, "
                    "static argument values) were seen; new ones run eagerly")
        return root.eager_reason if root is not None else None

    def replay_info(self, *args, **kwargs) -> dict:
        """How a warm call with these arguments replays: ``one_program`` (the whole guard tree is
        one compiled program: one dispatch), ``miss_flag`` (that program returns a flag the host
        reads, because some outcome is still unseen), ``eager`` (the reason calls run eagerly)."""
        leaves, key = input_key(args, kwargs)
        root = self.roots.get(key)
        prog = self._program(root, root.node) if root is not None and root.node.final is None \
            else None
        return {"one_program": prog is not None, "miss_flag": bool(prog and prog.flagged),
                "eager": self.eager_reason(key)}

    def _program(self, root, node):
        if node.program is None or node.program[0] != root.version:
            node.program = (root.version, one_program.build(node, self.exact))
        return node.program[1]

    def _replay(self, root, leaves):
        """Walk the guard tree without Python; from the second warm call, as one program."""
        arrays = leaves if root.all_arrays else _arrays(leaves)
        env = dict(enumerate(arrays))
        node, hot = root.node, root.warm_streak >= 1
        while True:
            if hot and node.final is None:
                prog = self._program(root, node)
                if prog is not None:
                    if node is root.node:  # later calls take the hot path in __call__
                        root.fast = prog
                    out = prog.call(env)
                    if out is one_program.MISS:
                        return _MISS
                    self.counts["fused"] += 1
                    return self._warm(root, out)
            seg = node.seg
            if seg is not None:
                env.update(zip(seg.out_slots, seg.run(*[env[s] for s in seg.in_slots])))
            if node.final is not None:
                tree, specs, _ = node.final
                return self._warm(root, jax.tree_util.tree_unflatten(
                    tree, [env[v] if k == "slot" else v for k, v in specs]))
            if node.kind is None or node.kind in TEXT_KINDS:
                return _MISS
            guard = guard_key(node.kind, CONVERT[node.kind](env[node.slot], *node.extra))
            node = node.children.get(guard)
            if node is None:
                return _MISS

    def _warm(self, root, out):
        self.counts["warm"] += 1
        root.warm_streak += 1
        return out

    def run_cold(self, root, leaves, tree):
        """Run the Python on deferred values, filling the guard tree; returns (result, run)."""
        self.counts["cold"] += 1
        self.hot.clear()  # the run may grow a tree: its one program is rebuilt
        run = ColdRun(self.cache, root, self.exact)
        vals = [run.input(x) if isinstance(x, _ARRAYS) else x for x in leaves]
        args, kwargs = jax.tree_util.tree_unflatten(tree, vals)
        del vals
        with set_current_trace(run.trace):
            out = self.fn(*args, **kwargs)
        del args, kwargs
        with set_current_trace(eval_trace):
            result = run.finish(out)
        del out
        run.check_escapes()
        if run.overflow is not None:
            root.eager_reason = root.eager_reason or run.overflow
        return result, run


def capture(fn: Callable, exact: bool = True) -> Captured:
    """Wrap ``fn`` for graph-break capture; ``capture(fn)(*args)`` equals ``fn(*args)``.

    ``exact=True`` (default) keeps eager's rounding bitwise (``exact_programs.py`` says how);
    ``exact=False`` lets XLA fuse and simplify each segment like ``jax.jit`` — faster for long
    elementwise chains, equal to eager only up to rounding.

    Example::

        f = capture(lambda x, w: jnp.exp(x @ w) if (x @ w).sum() > 0 else x @ w)
        f(x, w)   # cold: runs the Python, 2 graphs, 1 break
        f(x, w)   # warm: replays the cached segments, Python not run
    """
    return Captured(fn, exact)


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

    def __str__(self):
        lines = [f"graphs: {self.graph_count}, breaks: {self.graph_break_count}"]
        lines += [f"  graph {i + 1}: {ops}" for i, ops in enumerate(self.ops_per_graph)]
        lines += [f"  break {i + 1}: {b.reason} at {b.source}" for i, b in enumerate(self.break_reasons)]
        lines += [f"  note: {n}" for n in self.notes]
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

    On a :class:`Captured` function the run fills its guard tree as a call would, and
    ``fallback`` says if (and why) calls with these arguments run eagerly.
    """
    c = fn if isinstance(fn, Captured) else Captured(fn)
    leaves, key = input_key(args, kwargs)
    fallback = c.eager_reason(key)
    all_arrays = all(isinstance(x, _ARRAYS) for x in leaves)
    root = Root(all_arrays=all_arrays) if fallback else \
        c.roots.setdefault(key, Root(all_arrays=all_arrays))
    out, run = c.run_cold(root, leaves, _tree(args, kwargs))
    graphs = [seg.jaxpr() for seg in run.segments]
    return ExplainOutput(len(graphs), len(run.breaks), list(run.breaks),
                         [_op_names(g) for g in graphs], graphs, out,
                         fallback or run.overflow, _notes(run.segments))
