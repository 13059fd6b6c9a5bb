"""The guard tree of graph-break capture: segments, breaks, and one cold run that fills them.

A cold call (``ColdRun``) records dispatches (``recording.py``); at each break it runs the pending
segment dispatch by dispatch (as eager does), stores it in the current :class:`Node` with its
programs (``exact_programs.py``, compiled only when a warm call needs them), and moves to the child
keyed by the concrete value Python asked for (``break_guards.py``). Warm calls (``captured.py``) walk
the same tree without Python, or run it as one program (``one_program.py``).

The tree is bounded: a non-``bool`` guard keeps at most ``MAX_GUARD_VALUES`` outcomes and a tree
at most ``MAX_PATHS`` paths. A guard past its bound never stabilises (a ``float()`` of a value that
changes every call), so caching its outcomes would only grow memory: the run sets ``overflow``,
and the caller runs such calls eagerly and says why in ``explain()``. A root also holds the
guards on what its cold runs read from outside (``state_guards.py``), checked before each warm
call.
"""
from __future__ import annotations

import gc
import re
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import jax
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Jaxpr, eval_trace, set_current_trace
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute.capture.exact_programs import (as_param, bind_eqns, compile_pieces, const_key,
                                       run_pieces)
from mlsys_jax.execute.capture.break_guards import (CONVERT, checkable_on_device, guard_key, raw_bits)
from mlsys_jax.execute.capture.watching import untraced
from mlsys_jax.execute.capture.recording import DeferredTracer, Eqn, RecordTrace, user_frame
from mlsys_jax.execute.capture.state_guards import by_value, compile_check

MAX_GUARD_VALUES = 8  # outcomes kept per non-bool guard
MAX_PATHS = 64  # paths (returns) kept per input signature
MAX_RAWS = 16  # bit patterns a one-program replay checks per guard (then: read on the host)


@dataclass(eq=False)
class Segment:
    """One recorded graph: reads ``in_slots``, writes ``out_slots``.

    A cold call runs it dispatch by dispatch, exactly as eager runs the same code (no compile).
    Warm calls that walk the tree compile it from their second run on (``exact_programs.py``); a
    settled tree runs as one program instead (``one_program.py``), so most segments never compile alone.
    """

    compiled: Callable  # runs the pieces (compiling each on its first call)
    in_slots: tuple
    out_slots: tuple
    structure: tuple  # primitives (params as text), wiring, constants by value
    eqns: tuple
    consts: tuple  # device arrays: parameters of the compiled programs
    in_avals: tuple
    pieces: tuple
    warm_runs: int = 0

    def eager(self, *ins):
        """Run dispatch by dispatch, as eager JAX runs the recorded code."""
        env = dict(zip(self.in_slots, ins))
        with set_current_trace(eval_trace):
            bind_eqns(self.eqns, env, self.consts)
        return [env[s] for s in self.out_slots]

    def run(self, *ins):
        """A warm walk's run: eager the first time, compiled from the second."""
        self.warm_runs += 1
        return self.compiled(*ins) if self.warm_runs >= 2 else self.eager(*ins)

    @property
    def units(self) -> list[str]:
        """Names of the pieces that run as their own dispatch (empty when all run as one program)."""
        return [p.unit for p in self.pieces if p.unit]

    def one_program(self) -> bool:
        """Whether the whole segment compiles as a single program."""
        return len(self.pieces) == 1 and not self.pieces[0].unit

    def jaxpr(self):
        """The segment as a ClosedJaxpr (for the op view in ``explain``)."""
        def segment(*ins):
            env = dict(zip(self.in_slots, ins))
            bind_eqns(self.eqns, env, self.consts)
            return [env[s] for s in self.out_slots]
        return jax.make_jaxpr(segment)(*self.in_avals)


@dataclass(frozen=True)
class BreakReason:
    """Why the graph broke: what needed a concrete value, and the user's source line."""

    reason: str
    source: str


@dataclass(eq=False)
class Node:
    """A point of the guard tree: the segment run here, then a break (kind, slot) or the return."""

    seg: Segment | None = None
    kind: str | None = None
    slot: int | None = None
    extra: tuple = ()
    aval: Any = None  # the guard value's type
    children: dict = field(default_factory=dict)  # guard key -> Node
    raws: dict | None = field(default_factory=dict)  # bit pattern -> guard key; None: too many
    final: tuple | None = None  # (out_tree, specs, avals): specs ('slot', s), ('const', v),
    #   ('copy', a NumPy array returned afresh each call), ('leaf', i: the call's static leaf i)
    program: tuple | None = None  # (tree version, one-program replay or None)


@dataclass(eq=False)
class Root:
    """The guard tree of one input signature, with its bounds' state."""

    all_arrays: bool = True  # every argument leaf is an array (slot i is leaf i)
    node: Node = field(default_factory=Node)
    version: int = 0  # bumped when the tree grows: one-program replays are rebuilt
    fast: Any = None  # the whole tree's one-program replay, once hot (dropped when it grows)
    warm_streak: int = 0  # warm calls since the last change
    paths: int = 0
    eager_reason: str | None = None  # set when a bound was passed: calls run eagerly
    guards: dict = field(default_factory=dict)  # what the cold runs read from outside
    check: Callable | None = None  # all of ``guards`` at once (None: none)
    effect_runs: int = 0  # cold runs whose Python had a side effect

    def reset(self):
        """Forget the recorded paths and their guards (a run with a side effect is not replayed)."""
        self.node, self.paths, self.guards, self.check = Node(), 0, {}, None
        self.changed()

    def changed(self):
        """Note that the tree grew: warm calls restart their streak and the fast path is rebuilt."""
        self.version += 1
        self.warm_streak = 0
        self.fast = None

    def add_guards(self, guards: dict) -> None:
        """Keep a cold run's guards (the first read of a place decides what it must hold; of a
        ``latest`` guard — a cache the run calls — the latest run's end)."""
        new = {k: g for k, g in guards.items() if k not in self.guards or g.latest}
        if new or self.check is None and self.guards:
            self.guards.update(new)
            self.check = compile_check(list(self.guards.values()))


def output_leaves(specs, env, leaves):
    """A replayed path's output leaves: arrays from ``env``, Python constants as recorded, NumPy
    arrays copied (eager returns a new one each call), static argument leaves of this call."""
    return [env[v] if k == "slot" else v if k == "const" else v.copy() if k == "copy"
            else leaves[v] for k, v in specs]


@lru_cache(maxsize=4096)
def _body_text(body) -> str:
    return re.sub(r" at 0x[0-9a-f]+", "", repr(body))


def _params_text(params) -> tuple:
    # Re-traced bodies (a lax.cond of fresh lambdas) are new objects with the same text; jnp's
    # bodies are cached objects, so their text is computed once.
    return tuple((k, _body_text(v) if isinstance(v, (ClosedJaxpr, Jaxpr))
                  else re.sub(r" at 0x[0-9a-f]+", "", repr(v))) for k, v in sorted(params.items()))


class ColdRun:
    """One cold call: records segments, breaks at concrete-value requests, fills the guard tree."""

    def __init__(self, cache, root: Root, exact=True):
        self.cache, self.root, self.exact = cache, root, exact
        self.node = root.node
        self.trace = RecordTrace(self)
        self.next_slot = 0
        self.env: dict[int, Any] = {}
        self.pending: list[Eqn] = []
        self.consts: list = []
        self.const_index: dict[int, int] = {}
        self.live: dict[int, weakref.ref] = {}
        self.all_refs: list[weakref.ref] = []
        self.segments: list[Segment] = []
        self.breaks: list[BreakReason] = []
        self.overflow: str | None = None
        self.unreplayable: str | None = None  # set by finish: a return only Python can make
        self.effects: list[str] = []  # the side effects this run's Python had
        self.finished = False

    def input(self, value):
        """Wrap an argument value as a deferred tracer in the next input slot."""
        t = DeferredTracer(self.trace, jax.typeof(value), self.next_slot)
        t.val = self.env[t.slot] = value
        self.next_slot += 1
        self.all_refs.append(weakref.ref(t))
        return t

    def record(self, prim, params, args, out_avals, traits):
        """Defer one primitive application into the pending segment; tracers for its outputs, in new slots."""
        ins = []
        for a in args:
            if isinstance(a, DeferredTracer):
                ins.append(a.slot)
            else:
                i = self.const_index.get(id(a))
                if i is None:
                    i = self.const_index[id(a)] = len(self.consts)
                    self.consts.append(a)  # kept alive, so its id stays its own
                ins.append(-1 - i)
        outs = []
        for aval in out_avals:
            t = DeferredTracer(self.trace, aval, self.next_slot)
            self.next_slot += 1
            self.live[t.slot] = weakref.ref(t)
            self.all_refs.append(self.live[t.slot])
            outs.append(t)
        self.pending.append(Eqn(prim, dict(params), tuple(ins), tuple(t.slot for t in outs),
                                traits))
        return outs

    def flush(self, needed=()):
        """Store (or reuse) the pending segment and run it as eager does; materialize every value
        still alive."""
        eqns, consts = tuple(self.pending), tuple(self.consts)
        self.pending, self.consts, self.const_index = [], [], {}
        if not eqns:
            self._set_segment(None)
            return
        made = {s for e in eqns for s in e.outs}
        in_slots = tuple(dict.fromkeys(r for e in eqns for r in e.ins if r >= 0 and r not in made))
        alive = {s for s, ref in self.live.items() if ref() is not None}
        out_slots = tuple(sorted(alive | {s for s in needed if s in made}))
        structure = (tuple((e.prim.name, _params_text(e.params), e.ins, e.outs) for e in eqns),
                     tuple(const_key(c) for c in consts))
        old = self.node.seg
        if old is not None and (old.structure != structure or old.in_slots != in_slots
                                or not set(out_slots) <= set(old.out_slots)):
            self._impure()
            old = None
        if old is not None:  # a later cold call on a known path: same structure, reuse the program
            seg = old
        else:
            params = tuple(as_param(c) for c in consts)
            pieces = tuple(compile_pieces(eqns, params, in_slots, out_slots, self.exact,
                                          self.cache))
            in_avals = tuple(jax.typeof(self.env[s]) for s in in_slots)
            seg = Segment(run_pieces(pieces, in_slots, out_slots), in_slots, out_slots, structure,
                          eqns, params, in_avals, pieces)
        outs = seg.eager(*[self.env[s] for s in in_slots])  # for real, not into the recording
        self.env.update(zip(seg.out_slots, outs))
        for s in seg.out_slots:
            t = self.live[s]() if s in self.live else None
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
        """A known path recorded again came out different: the Python depends on state no guard
        covers. This call stays right (a cold run computes as eager does); it records into a
        tree of its own, and later calls run eagerly."""
        self.root.eager_reason = self.root.eager_reason or (
            "it recorded different operations than an earlier call with the same input types, "
            "branch values and guarded reads: it depends on state capture does not see (data "
            "reached through a C extension, a dynamic getattr), so calls with these argument "
            "types run eagerly")
        self.node = Node()

    def graph_break(self, tracer, kind, *extra):
        """End the segment where Python needs a concrete value, and record why (capture's own work, unwatched)."""
        return untraced(self._graph_break, tracer, kind, *extra)  # capture's own work: unwatched

    def _graph_break(self, tracer, kind, *extra):
        if self.finished:
            raise MlsysError(
                f"capture: a deferred value ({tracer.aval.str_short()}) was used after its call "
                "returned: it was stored outside the function. Return it instead.")
        reason = BreakReason(f"{kind}() of a deferred {tracer.aval.str_short()}", user_frame())
        self.breaks.append(reason)
        with set_current_trace(eval_trace):
            self.flush(needed=(tracer.slot,) if tracer.val is None else ())
            py = CONVERT[kind](tracer.val, *extra)
        self._descend(tracer, kind, extra, guard_key(kind, py), reason)
        return py

    def _descend(self, tracer, kind, extra, key, reason):
        node = self.node
        if node.kind is None:
            node.kind, node.slot, node.extra, node.aval = kind, tracer.slot, extra, tracer.aval
        child = node.children.get(key)
        if child is None:
            if kind != "bool" and len(node.children) >= MAX_GUARD_VALUES:
                self.overflow = self.overflow or (
                    f"the guard {reason.reason} at {reason.source} took more than "
                    f"{MAX_GUARD_VALUES} different values: it never stabilises, so calls with "
                    "these argument types run eagerly")
                self.node = Node()  # keep recording (this call's result), cache nothing more
                return
            child = node.children[key] = Node()
            self.root.changed()
        if node.raws is not None and checkable_on_device(kind, tracer.aval):
            raw = raw_bits(tracer.val)
            assert node.raws.get(raw, key) == key, "one bit pattern, two guard outcomes"
            if raw not in node.raws:
                node.raws[raw] = key
                if len(node.raws) > MAX_RAWS:
                    node.raws = None  # too many values to check on device: read on the host
                self.root.changed()
        self.node = child

    def finish(self, out, static_leaves=(), outside=()):
        """The call's result, and the return recorded in the tree. ``static_leaves`` are the
        call's non-array argument leaves, ``outside`` the ids of objects read from outside:
        a returned object that is neither, nor a constant, was made by the call
        (``unreplayable`` says which: eager would return a new one each call)."""
        leaves, out_tree = jax.tree_util.tree_flatten(out)
        self.flush(needed=[x.slot for x in leaves if isinstance(x, DeferredTracer)])
        static = {id(x): i for i, x in enumerate(static_leaves)}
        specs = tuple(self._spec(x, static, outside) for x in leaves)
        avals = tuple(x.aval if isinstance(x, DeferredTracer) else None for x in leaves)
        if self.node.final is None:
            self.node.final = (out_tree, specs, avals)
            self.root.paths += 1
            self.root.changed()
            if self.root.paths > MAX_PATHS:
                self.overflow = self.overflow or (
                    f"more than {MAX_PATHS} different paths through the function's branches for "
                    "these argument types (the branch values never stabilise), so calls with "
                    "them run eagerly")
        self.finished = True
        return jax.tree_util.tree_unflatten(out_tree, output_leaves(specs, self.env, static_leaves))

    def _spec(self, x, static: dict, outside) -> tuple:
        if isinstance(x, DeferredTracer):
            return ("slot", x.slot)
        if id(x) in static:
            return ("leaf", static[id(x)])
        if isinstance(x, np.ndarray):
            return ("copy", x.copy())
        if not (by_value(x) or isinstance(x, (jax.Array, type, np.dtype)) or callable(x)
                or id(x) in outside):
            self.unreplayable = self.unreplayable or (
                f"it returns a {type(x).__name__} it makes (eager returns a new one each call)")
        return ("const", x)

    def check_escapes(self):
        """Deferred values still referenced after the call (outputs are concrete) were stored away."""
        escaped = [r() for r in self.all_refs if r() is not None]
        if escaped:
            del escaped
            gc.collect()  # reference cycles inside the function's own locals are not escapes
            escaped = [r() for r in self.all_refs if r() is not None]
        if escaped:
            self.root.eager_reason = self.root.eager_reason or (
                "a deferred value escaped the function inside an object capture cannot update "
                "(a tuple, or data held elsewhere); calls with these argument types run eagerly")
            raise MlsysError(
                f"capture: {len(escaped)} deferred value(s) (e.g. {escaped[0].aval.str_short()}) "
                "escaped the captured function inside something capture cannot update (a tuple, "
                "an object it did not see): that value is not an array. Return the values "
                "instead; later calls with these argument types run eagerly.")
