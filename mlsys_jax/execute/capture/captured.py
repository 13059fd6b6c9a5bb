"""Graph-break capture: :class:`Captured`, what ``capture(fn)`` returns (lecture §8.4, exercise 8).

``capture(fn)`` runs ``fn``'s Python on deferred values (``recording.py``) and collects JAX
dispatches into a graph *segment*. Where Python needs a concrete value — ``bool`` (an ``if`` or
``while``), ``int``/``__index__``, ``float``, ``item``/``tolist``/``np.asarray``, or printing — the
graph breaks: the segment so far is compiled and run, Python gets the value, and recording
continues in a new segment. Like ``torch._dynamo.explain``, ``explain`` (``explanation.py``)
reports the graphs, the breaks (what needed a value, and the source line) and each graph's ops.

Guarded replay. Compiled segments are kept in a tree keyed by the inputs' shapes, dtypes and
weak types (plus the values of non-array arguments; NumPy arrays by their contents, since NumPy
computes with them in Python) and, after each break, by the concrete value Python branched on,
floats by bit pattern (``break_guards.py``). A warm call replays that tree without running
``fn``'s Python or retracing; from the second warm call on a settled tree, the tree below a break
runs as one program (``one_program.py``): one dispatch, no guard read on the host.

What the Python read from outside its arguments is guarded too, as torch.compile guards a frame:
globals, closure variables, attributes and items of outside objects (``reads.py`` watches a cold
run, ``state_guards.py`` checks the guards). A warm call whose guards fail records again, up to
``MAX_RECORDINGS`` times per input signature, then runs eagerly; ``explain`` names the guard. A
call whose Python has a side effect (``print``, an append to an outside list, an attribute or
global written) runs eagerly from then on, since a replay would skip it. What capture still
refuses is an :class:`~mlsys_jax.errors.MlsysError`: JAX primitives with effects other than
debug printing, a deferred value escaping where it cannot be replaced by its array.

Exact mode (default): results equal eager JAX bitwise — values, dtypes and weak types. How the
compiled programs keep eager's rounding (fusion off, barriers between dispatches, constants as
parameters, fused ``jit`` calls run on their own) is measured in ``exact_programs.py``. The cache
is bounded: past ``MAX_SIGNATURES`` input signatures, or a guard that never stabilises
(``guard_tree.py``), calls run eagerly and ``explain`` says why. ``exact=False`` lets XLA fuse
and simplify each segment like ``jax.jit``: faster, equal to eager up to rounding.
"""
from __future__ import annotations

import hashlib
from operator import attrgetter
from typing import Callable

import jax
import numpy as np

from mlsys_jax.compat import ArrayImpl, Tracer, eval_trace, set_current_trace
from mlsys_jax.errors import MlsysError
from mlsys_jax.execute.capture import one_program
from mlsys_jax.execute.capture.break_guards import CONVERT, TEXT_KINDS, guard_key, value_key
from mlsys_jax.execute.capture.guard_tree import ColdRun, Root, output_leaves
from mlsys_jax.execute.capture.reads import ReadWatch
from mlsys_jax.execute.capture.state_guards import compile_check, first_failure

MAX_SIGNATURES = 32  # input signatures (shapes, dtypes, static values) cached per function
MAX_RECORDINGS = 8  # recordings of one signature whose guards failed; then it runs eagerly
MAX_EFFECT_RUNS = 2  # cold runs with a side effect before a signature runs eagerly (the first
# call of a lazily built model has one: keras sets ``_called``)
_MISS = object()
_PROGRAM_MISS = one_program.MISS  # what a program or the guarded hot path returns on a miss
_JAX_ARRAY = frozenset([ArrayImpl])  # the argument types of a warm call's hot path
_aval = attrgetter("aval")


def _leaf_key(x):
    if isinstance(x, Tracer):
        raise MlsysError(
            f"capture: got a {type(x).__name__} argument; a captured function takes concrete "
            "arrays. Apply jax.grad/vmap/jit inside the captured function, not around it.")
    if isinstance(x, jax.Array):
        return x.aval  # shape, dtype, weak type (cached on the array: the cheapest key)
    if isinstance(x, np.ndarray):  # NumPy computes with it in Python: keyed by its contents
        a = np.ascontiguousarray(x)
        return ("np", a.shape, a.dtype.str,
                hashlib.blake2b(a.reshape(-1).view(np.uint8), digest_size=16).digest())
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


def argument_tree(args, kwargs):
    """The pytree structure of a call's arguments, part of the key that picks its guard tree."""
    return jax.tree_util.tree_structure((args, kwargs))


def _arrays(leaves):
    """The leaves that are inputs of the recorded programs (JAX arrays; NumPy ones stay NumPy)."""
    return [x for x in leaves if isinstance(x, jax.Array)]




def _argument_state(args, kwargs):
    leaves, tree = jax.tree_util.tree_flatten((args, kwargs))
    return tree, [id(x) for x in leaves]


class Captured:
    """``fn`` with graph-break capture and guarded replay of its compiled segments (see module doc)."""

    def __init__(self, fn: Callable, exact: bool = True):
        if not callable(fn):
            raise MlsysError(f"capture: expected a callable, got {type(fn).__name__}")
        self.fn, self.exact = fn, exact
        self.roots: dict = {}  # input key -> Root (its guard tree)
        self.cache: dict = {}  # program signature -> jitted program (shared across the tree)
        self.counts = {"cold": 0, "warm": 0, "fused": 0, "eager": 0}  # all but the hot path's
        # input key -> the settled tree's one program as a function of the arguments (behind
        # its guards): a warm call with array arguments runs it with no generic key, lookup or
        # env (cleared by every cold run, the only place a tree or its guards grow)
        self.hot: dict = {}
        self.hot_calls = 0  # the hot path's count: one integer, not two dict updates
        self.failures: dict = {}  # input key -> guard failures that made it record again
        self.__wrapped__ = fn

    @property
    def stats(self) -> dict:
        """Calls by kind: ``cold`` (ran the Python), ``warm`` (replayed), ``fused`` (warm, as one
        program), ``eager`` (past a bound, or with side effects)."""
        hot = self.hot_calls
        return {**self.counts, "warm": self.counts["warm"] + hot,
                "fused": self.counts["fused"] + hot}

    def __call__(self, *args, **kwargs):
        if not kwargs and _JAX_ARRAY.issuperset(map(type, args)):
            direct = self.hot.get(tuple(map(_aval, args)))  # input_key's key for these args
            if direct is not None:
                out = direct(*args)
                if out is not _PROGRAM_MISS:
                    self.hot_calls += 1
                    return out
        leaves, key = input_key(args, kwargs)
        root = self.root_for(key, leaves)
        if root is None or root.eager_reason is not None:
            return self._eager(args, kwargs)
        prog = root.fast
        if prog is not None:  # the whole tree as one program
            out = prog.call(leaves if root.all_arrays else _arrays(leaves))
            if out is not one_program.MISS:
                self.counts["fused"] += 1
                self.counts["warm"] += 1
                if not kwargs and leaves is args:  # every argument a jax array
                    direct = prog.direct(len(args))
                    if direct is not None:
                        self.hot[key] = compile_check(list(root.guards.values()), direct,
                                                      one_program.MISS)
                return out
        else:
            out = self._replay(root, leaves)
            if out is not _MISS:
                return out
        return self.run_cold(root, leaves, argument_tree(args, kwargs), (args, kwargs))[0]

    def root_for(self, key, leaves) -> Root | None:
        """The guard tree for a call with these arguments, after checking its guards on what
        the Python read: recorded again (a new tree) where one fails; None past the bound."""
        root = self.roots.get(key)
        if root is None:
            if len(self.roots) >= MAX_SIGNATURES:
                return None
            root = self.roots[key] = Root(all_arrays=all(isinstance(x, jax.Array)
                                                         for x in leaves))
        elif root.check is not None and root.eager_reason is None and not root.check():
            failed = first_failure(list(root.guards.values()))
            why = failed.failure() if failed is not None else "a guard changed"
            seen = self.failures.setdefault(key, [])
            seen.append(why)
            self.hot.pop(key, None)
            if len(seen) > MAX_RECORDINGS:
                root.eager_reason = (f"{why}: what the Python reads changed on {len(seen)} calls, "
                                     "so calls with these argument types run eagerly")
            else:
                root = self.roots[key] = Root(all_arrays=root.all_arrays)
        return root

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
                    tree, output_leaves(specs, env, [x for x in leaves
                                                     if not isinstance(x, jax.Array)])))
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

    def run_cold(self, root, leaves, tree, call):
        """Run the Python on deferred values, filling the guard tree and its guards on what the
        Python reads; returns (result, run). A side effect makes such calls run eagerly.
        ``call`` is the caller's own ``(args, kwargs)``."""
        self.counts["cold"] += 1
        self.hot.clear()  # the run may grow a tree: its one program is rebuilt
        run = ColdRun(self.cache, root, self.exact)
        static = [x for x in leaves if not isinstance(x, jax.Array)]
        args, kwargs = jax.tree_util.tree_unflatten(
            tree, [run.input(x) if isinstance(x, jax.Array) else x for x in leaves])
        watch, before = ReadWatch(self.fn, static, tree), _argument_state(args, kwargs)
        try:
            with set_current_trace(run.trace), watch:
                out = self.fn(*args, **kwargs)
        finally:
            root.add_guards(watch.guards)
        changed_arguments = _argument_state(args, kwargs) != before
        del args, kwargs
        with set_current_trace(eval_trace):
            result = run.finish(out, static, watch.outside)
        del out
        effects = watch.finish()
        if changed_arguments:
            # the Python changed a container it was passed: capture passed its own copy, so
            # only eager can make that change where the caller sees it
            root.eager_reason = ("it changes an argument (a list or dict passed in), which "
                                 "capture passes as a copy; calls with these argument types run "
                                 "eagerly")
            if not effects:  # nothing else happened in this call: run it as eager would
                del result
                return self._eager(*call), run
            raise MlsysError(f"capture: {root.eager_reason}; this call's change did not reach the "
                             "caller's container")
        run.effects = effects
        if watch.unguarded is not None:  # a replay could return what it held this time
            root.eager_reason = root.eager_reason or (
                f"it reads {watch.unguarded}, which capture cannot guard (a replay could return "
                "a stale value), so calls with these argument types run eagerly")
        if effects:  # not replayed: the next call runs the Python again, then eagerly
            root.effect_runs += 1
            if root.effect_runs < MAX_EFFECT_RUNS:
                root.reset()
            else:
                root.eager_reason = root.eager_reason or (
                    f"a Python side effect: it {effects[0]}; warm calls replay compiled programs "
                    "without running the Python, so calls with these argument types run eagerly")
        elif run.unreplayable is not None:
            root.eager_reason = root.eager_reason or (
                f"{run.unreplayable}; warm calls replay what the first call returned, so calls "
                "with these argument types run eagerly")
        run.check_escapes()
        if run.overflow is not None:
            root.eager_reason = root.eager_reason or run.overflow
        return result, run


def capture(fn: Callable, exact: bool = True) -> Captured:
    """Wrap ``fn`` for graph-break capture; ``capture(fn)(*args)`` equals ``fn(*args)``.

    ``exact=True`` (default) keeps eager's rounding bitwise (``exact_programs.py`` says how);
    ``exact=False`` lets XLA fuse and simplify each segment like ``jax.jit`` — faster for long
    elementwise chains, equal to eager only up to rounding.

    A Python ``if`` on a value is a graph break: the graph before it and the branch taken are
    captured, and the next call with the same guard outcomes replays them.

    >>> import jax.numpy as jnp
    >>> f = capture(lambda x: jnp.exp(x) if x.sum() > 0 else -x)
    >>> x = jnp.ones(3)
    >>> bool((f(x) == jnp.exp(x)).all()), bool((f(-x) == x).all())   # bitwise equal to eager
    (True, True)
    """
    return Captured(fn, exact)
