"""The guard tree of graph-break capture: segments, breaks, and one cold run that fills them.

A cold call (``ColdRun``) records primitives (``_record.py``), and at each break compiles and runs
the pending segment, stores it in the current :class:`Node`, and moves to the child keyed by the
concrete value Python asked for. Warm calls (``capture.py``) walk the same tree without Python.
"""
from __future__ import annotations

import gc
import hashlib
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

from mlsys_jax.compat import eval_trace, set_current_trace
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute._record import (EXACT_OPTIONS, DeferredTracer, Eqn, RecordTrace, replay,
                                      segment_jaxpr, user_frame)

CONVERT = {  # bool/int/float through NumPy: the same value, ~6 µs cheaper than jax.Array's
    "bool": lambda v, *a: bool(np.asarray(v)), "int": lambda v, *a: int(np.asarray(v)),
    "float": lambda v, *a: float(np.asarray(v)),
    "complex": lambda v, *a: complex(v), "index": lambda v, *a: v.__index__(),
    "item": lambda v, *a: v.item(*a), "tolist": lambda v, *a: v.tolist(),
    "array": lambda v, *a: np.asarray(v),
    "str": lambda v, *a: str(v), "repr": lambda v, *a: repr(v), "format": lambda v, *a: format(v, *a),
}
TEXT_KINDS = frozenset({"str", "repr", "format"})  # Python consumes text: not replayable


def guard_key(kind, py):
    """The cache key of a break's concrete value (arrays by bytes, text kinds not replayable)."""
    if kind in TEXT_KINDS:
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
    structure: tuple  # primitives (params as text), wiring, constants by value
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


def const_key(c):
    """A constant by value (cold path only): a fresh ``jnp.ones`` each call is the same constant."""
    if isinstance(c, (bool, int, float, complex)):
        return (type(c).__name__, c)
    arr = np.asarray(c)
    digest = hashlib.sha1(arr.tobytes()).hexdigest()
    return (arr.dtype.str, arr.shape, bool(getattr(c, "weak_type", False)), digest)


def _params_text(params) -> str:
    # Re-traced bodies (a lax.cond of fresh lambdas) are new objects with the same text.
    return re.sub(r" at 0x[0-9a-f]+", "", repr(sorted(params.items())))


class ColdRun:
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
        wiring = tuple(tuple(local[r] if r >= 0 else r for r in e.ins) for e in eqns)
        ckeys, outs_local = tuple(const_key(c) for c in consts), tuple(local[s] for s in out_slots)
        structure = (tuple((e.prim.name, _params_text(e.params)) for e in eqns), wiring, ckeys)
        old = self.node.seg
        if old is not None:  # a later cold call on a known path: same structure, reuse the program
            if (old.structure != structure or old.in_slots != in_slots
                    or not set(out_slots) <= set(old.out_slots)):
                self._impure()
            seg, out_slots = old, old.out_slots
        else:
            sig = (tuple((e.prim, tuple(sorted(e.params.items()))) for e in eqns), wiring, ckeys,
                   outs_local)
            fn = self.cache.get(sig) or jax.jit(replay(eqns, consts, in_slots, out_slots),
                                                compiler_options=EXACT_OPTIONS if self.exact else None)
            self.cache[sig] = fn
            in_avals = tuple(jax.typeof(self.env[s]) for s in in_slots)
            seg = Segment(fn, in_slots, out_slots, structure, eqns, consts, in_avals)
        fn = seg.fn
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
        if self.node.seg is not None and seg is not self.node.seg:
            self._impure()
        self.node.seg = seg

    def _impure(self):
        raise MlsysError(
            "capture: the function recorded different operations on the same input shapes and "
            "branch values than on an earlier call: it depends on state outside its arguments "
            "(a global, a counter, randomness), so cached segments cannot be replayed. Make it "
            "pure (pass that state as an argument) or call it eagerly.")

    def graph_break(self, tracer, kind, *extra):
        if self.finished:
            raise MlsysError(
                f"capture: a deferred value ({tracer.aval.str_short()}) was used after its call "
                "returned: it was stored outside the function. Return it instead.")
        self.breaks.append(BreakReason(
            f"{kind}() of a deferred {tracer.aval.str_short()}", user_frame()))
        with set_current_trace(eval_trace):
            self.flush(needed=(tracer.slot,) if tracer.val is None else ())
            py = CONVERT[kind](tracer.val, *extra)
        node = self.node
        if node.kind is None:
            node.kind, node.slot, node.extra = kind, tracer.slot, extra
        self.node = node.children.setdefault(guard_key(kind, py), Node())
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
