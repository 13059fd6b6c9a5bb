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
child — without running ``fn``'s Python or retracing. This is sound for *pure* functions (the
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

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from mlsys_jax.compat import Tracer, eval_trace, set_current_trace
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute._record import (EXACT_OPTIONS, DeferredTracer, Eqn, RecordTrace, replay,
                                      segment_jaxpr, user_frame)

_CONVERT = {  # bool/int/float through NumPy: the same value, ~6 µs cheaper than jax.Array's
    "bool": lambda v, *a: bool(np.asarray(v)), "int": lambda v, *a: int(np.asarray(v)),
    "float": lambda v, *a: float(np.asarray(v)),
    "complex": lambda v, *a: complex(v), "index": lambda v, *a: v.__index__(),
    "item": lambda v, *a: v.item(*a), "tolist": lambda v, *a: v.tolist(),
    "array": lambda v, *a: np.asarray(v),
    "str": lambda v, *a: str(v), "repr": lambda v, *a: repr(v), "format": lambda v, *a: format(v, *a),
}
_TEXT = frozenset({"str", "repr", "format"})  # Python consumes text: not replayable


def _guard(kind, py):
    """The cache key of a break's concrete value (arrays by bytes, text kinds not replayable)."""
    if kind in _TEXT:
        return (kind, None)
    if kind == "array":
        return (kind, py.shape, py.dtype.str, py.tobytes())
    if kind == "tolist":
        return (kind, repr(py))
    return (kind, py)


@dataclass
class Segment:
    """One compiled graph: reads ``in_slots``, writes ``out_slots``; ``fn`` is its jax.jit."""

    fn: Callable
    in_slots: tuple
    out_slots: tuple
    signature: tuple
    eqns: tuple
    consts: tuple
    in_avals: tuple

    def jaxpr(self):
        return segment_jaxpr(self.eqns, self.consts, self.in_slots, self.out_slots, self.in_avals)


@dataclass
class Node:
    """A point of the guard tree: the segment run here, then a break (kind, slot) or the return."""

    seg: Segment | None = None
    kind: str | None = None
    slot: int | None = None
    extra: tuple = ()
    children: dict = field(default_factory=dict)
    final: tuple | None = None  # (out_tree, specs): ('slot', s) or ('const', value) per leaf


@dataclass(frozen=True)
class BreakReason:
    """Why the graph broke: what needed a concrete value, and the user's source line."""

    reason: str
    source: str


def _const_key(c):
    if isinstance(c, (bool, int, float, complex)):
        return (type(c).__name__, c)
    arr = np.asarray(c) if not isinstance(c, jax.Array) or c.size <= 64 else None
    if arr is not None and arr.size <= 64:
        return (arr.dtype.str, arr.shape, getattr(c, "weak_type", False), arr.tobytes())
    return ("id", id(c))  # large constants: the cached segment keeps the object alive


class _Run:
    """One cold call: records segments, breaks at concrete-value requests, fills the guard tree."""

    def __init__(self, cache, node, exact=True):
        self.cache, self.node, self.exact = cache, node, exact
        self.trace = RecordTrace(self)
        self.next_slot = 0
        self.env: dict[int, Any] = {}
        self.pending: list[Eqn] = []
        self.consts: list = []
        self.live: dict[int, weakref.ref] = {}
        self.all_refs: list[weakref.ref] = []
        self.segments: list[Segment] = []
        self.breaks: list[BreakReason] = []
        self.finished = False

    def input(self, value):
        t = DeferredTracer(self.trace, jax.typeof(value), self.next_slot)
        t.val = self.env[t.slot] = value
        self.next_slot += 1
        self.all_refs.append(weakref.ref(t))
        return t

    def record(self, prim, params, args, out_avals):
        ins = []
        for a in args:
            if isinstance(a, DeferredTracer):
                ins.append(a.slot)
            else:
                ids = [i for i, c in enumerate(self.consts) if c is a]
                if not ids:
                    self.consts.append(a)
                ins.append(-1 - (ids[0] if ids else len(self.consts) - 1))
        outs = []
        for aval in out_avals:
            t = DeferredTracer(self.trace, aval, self.next_slot)
            self.next_slot += 1
            self.live[t.slot] = weakref.ref(t)
            self.all_refs.append(self.live[t.slot])
            outs.append(t)
        self.pending.append(Eqn(prim, dict(params), tuple(ins), tuple(t.slot for t in outs)))
        return outs

    def flush(self, needed=()):
        """Compile (or reuse) and run the pending segment; materialize every value still alive."""
        eqns, consts = tuple(self.pending), tuple(self.consts)
        self.pending, self.consts = [], []
        if not eqns:
            self._set_segment(None)
            return
        made = {s for e in eqns for s in e.outs}
        in_slots = tuple(dict.fromkeys(r for e in eqns for r in e.ins if r >= 0 and r not in made))
        alive = {s for s, ref in self.live.items() if ref() is not None}
        out_slots = tuple(sorted(alive | {s for s in needed if s in made}))
        local = {s: i for i, s in enumerate(in_slots + tuple(s for e in eqns for s in e.outs))}
        sig = (tuple((e.prim, tuple(sorted(e.params.items())),
                      tuple(local[r] if r >= 0 else r for r in e.ins)) for e in eqns),
               tuple(_const_key(c) for c in consts), tuple(local[s] for s in out_slots))
        fn = self.cache.setdefault(sig, None) or jax.jit(
            replay(eqns, consts, in_slots, out_slots),
            compiler_options=EXACT_OPTIONS if self.exact else None)
        self.cache[sig] = fn
        in_avals = tuple(jax.typeof(self.env[s]) for s in in_slots)
        seg = Segment(fn, in_slots, out_slots, sig, eqns, consts, in_avals)
        with set_current_trace(eval_trace):  # run the segment for real, not into the recording
            outs = fn(*[self.env[s] for s in in_slots])
        self.env.update(zip(out_slots, outs))
        for s in out_slots:
            t = self.live[s]()
            if t is not None:
                t.val = self.env[s]
        self.live.clear()
        self.segments.append(seg)
        self._set_segment(seg)

    def _set_segment(self, seg):
        old = self.node.seg
        if old is not None and (seg is None or old.signature != seg.signature
                                or old.in_slots != seg.in_slots):
            raise MlsysError(
                "capture: the function recorded different operations on the same input shapes "
                "and branch values than on an earlier call: it depends on state outside its "
                "arguments (a global, a counter, randomness), so cached segments cannot be "
                "replayed. Make it pure (pass that state as an argument) or call it eagerly.")
        self.node.seg = seg

    def graph_break(self, tracer, kind, *extra):
        if self.finished:
            raise MlsysError(
                f"capture: a deferred value ({tracer.aval.str_short()}) was used after its call "
                "returned: it was stored outside the function. Return it instead.")
        self.breaks.append(BreakReason(
            f"{kind}() of a deferred {tracer.aval.str_short()}", user_frame()))
        with set_current_trace(eval_trace):
            self.flush(needed=(tracer.slot,) if tracer.val is None else ())
            py = _CONVERT[kind](tracer.val, *extra)
        node = self.node
        if node.kind is None:
            node.kind, node.slot, node.extra = kind, tracer.slot, extra
        self.node = node.children.setdefault(_guard(kind, py), Node())
        return py

    def finish(self, out):
        leaves, out_tree = jax.tree_util.tree_flatten(out)
        self.flush(needed=[x.slot for x in leaves if isinstance(x, DeferredTracer)])
        specs = tuple(("slot", x.slot) if isinstance(x, DeferredTracer) else ("const", x)
                      for x in leaves)
        self.node.final = (out_tree, specs)
        self.finished = True
        return jax.tree_util.tree_unflatten(
            out_tree, [self.env[s[1]] if s[0] == "slot" else s[1] for s in specs])

    def check_escapes(self):
        """Deferred values still referenced after the call (outputs are concrete) were stored away."""
        escaped = [r() for r in self.all_refs if r() is not None]
        if escaped:
            del escaped
            gc.collect()  # reference cycles inside the function's own locals are not escapes
            escaped = [r() for r in self.all_refs if r() is not None]
        if escaped:
            raise MlsysError(
                f"capture: {len(escaped)} deferred value(s) (e.g. {escaped[0].aval.str_short()}) "
                "escaped the captured function (stored in a global, a list or an attribute). "
                "Warm calls replay compiled segments without running Python, so that side effect "
                "would not happen again. Return the values instead.")


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
        self.stats = {"cold": 0, "warm": 0}
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
            seg = node.seg
            if seg is not None:
                env.update(zip(seg.out_slots, seg.fn(*[env[s] for s in seg.in_slots])))
            if node.final is not None:
                tree, specs = node.final
                return jax.tree_util.tree_unflatten(
                    tree, [env[v] if k == "slot" else v for k, v in specs])
            if node.kind is None or node.kind in _TEXT:
                return _MISS
            guard = _guard(node.kind, _CONVERT[node.kind](env[node.slot], *node.extra))
            node = node.children.get(guard)
            if node is None:
                return _MISS

    def run_cold(self, key, leaves, tree):
        """Run the Python on deferred values, filling the guard tree; returns (result, run)."""
        self.stats["cold"] += 1
        run = _Run(self.cache, self.roots.setdefault(key, Node()), self.exact)
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
    chains, equal to eager only up to rounding.

    Example::

        f = capture(lambda x, w: jnp.exp(x @ w) if (x @ w).sum() > 0 else x @ w)
        f(x, w)   # cold: runs the Python, 2 graphs, 1 break
        f(x, w)   # warm: replays the cached segments, Python not run
    """
    return Captured(fn)


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
