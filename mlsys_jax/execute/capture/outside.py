"""The objects a cold run reached from outside the call, and what they held when it did.

An object comes from outside when the Python read it from a global, a closure, another outside
object, or it is the captured callable itself (its bound ``self``, its defaults, what it wraps)
or a static argument. :class:`OutsideObjects` keeps each, by identity, with a snapshot — a list's,
dict's or set's items, a NumPy array's bytes, an object's own attributes (its ``__dict__`` and
slots) — and a guard on a container's or array's contents. Their functions' code lets a watched
frame find its closure cells; their attributes' names let a read on an object the watch could not
see (``f().w``) be guarded on every outside object that has it. After the call,
:meth:`OutsideObjects.changes` says what the Python changed (a side effect) and puts concrete
arrays where it stored deferred values.
"""
from __future__ import annotations

import collections
import contextvars
import functools
import sys
import types

import numpy as np

from mlsys_jax.execute.capture import effects, process_state
from mlsys_jax.execute.capture.state_guards import (UNKNOWN, StateGuard, attributes,
                                                    contents_of, instance_dict, same_contents)
from mlsys_jax.execute.capture.watching import immutable

_C_METHODS = (types.BuiltinMethodType, types.MethodWrapperType)  # bound methods of C types
MAX_REGISTERED = 8192  # objects from outside one cold run keeps (items of containers included)


class OutsideObjects:
    """The registry of one cold run; contents guards go into ``guards`` (the run's)."""

    def __init__(self, guards: dict):
        self.guards = guards
        self.known: dict = {}  # id -> (object, what it was read as)
        self.snapshots: list = []  # (object, snapshot, what, own attributes?)
        self.by_code: dict = {}  # code -> functions from outside with that code
        self.by_attr: dict = {}  # attribute name -> outside objects that hold it
        self.overflow: str | None = None  # set when more is reached than is kept
        self.unguarded: str | None = None  # the first read capture cannot guard (a C buffer)
        self.caches: list = []  # (an lru_cache's entries, what): guarded as the run ends

    def register(self, v, what):
        """Keep ``v`` (read as ``what``) as an object from outside, with its snapshots, its
        functions' code, its attributes' names, its items (of a container) and what it wraps."""
        if id(v) in self.known:
            return
        if process_state.special(v):
            said = process_state.describe(v)
            what = what if what.startswith(said) else f"{said} ({what})"
            if self._special(v, what):
                return
        if immutable(v):
            return
        if len(self.known) >= MAX_REGISTERED:  # unguarded from here on: not replayed
            self.overflow = self.overflow or f"more than {MAX_REGISTERED} objects, at {what}"
            return
        self.known[id(v)] = (v, what)
        if isinstance(v, types.FunctionType):
            self.by_code.setdefault(v.__code__, []).append(v)
        if isinstance(v, types.MethodType):  # a bound method: its object and its function
            self.register(v.__self__, what)
            self.register(v.__func__, what)
        elif isinstance(v, _C_METHODS) and not isinstance(v.__self__, types.ModuleType):
            self.register(v.__self__, what)  # CONFIG.get bound before the call: CONFIG
        elif isinstance(v, functools.partial):
            for part in (v.func, *v.args, *v.keywords.values()):
                self.register(part, what)
        for part in ("__wrapped__", "fun"):  # functools.wraps, jax.jit, custom_jvp keep the function
            inner = instance_dict(v).get(part, UNKNOWN) if instance_dict(v) is not None \
                else UNKNOWN
            if inner is not UNKNOWN and callable(inner):
                self.register(inner, what)
        if hasattr(type(v), "__next__"):  # an iterator, a generator: its position is C state
            self.overflow = self.overflow or (f"an iterator ({what}), whose position capture "
                                              "cannot see")
            return
        container = isinstance(v, (list, dict, set, collections.deque))
        if isinstance(v, (np.ndarray, *process_state.CONTENTS)) or container:
            snap = contents_of(v)
            self.snapshots.append((v, snap, what, False))
            head = "the value of" if isinstance(v, contextvars.ContextVar) else "the contents of"
            self.guards[("contents", id(v), None)] = StateGuard(
                f"{head} {what}", "the call", "contents", v, None, snap)
        if isinstance(v, contextvars.ContextVar):  # its value, if a container, by its contents
            self.register(v.get(None), f"the value of {what}")
        elif isinstance(v, dict):
            for key, item in v.items():
                self.register(item, outside_of(f"item {key!r}", what))
        elif container or type(v) is tuple:
            for i, item in enumerate(list(v)):
                self.register(item, outside_of(f"item {i}", what))
        if not isinstance(v, (types.ModuleType, type, np.ndarray, tuple)):
            own = attributes(v)  # a container's too: a subclass may keep attributes
            if own:
                self.snapshots.append((v, own, f"the attributes of {what}", True))
                for name in own:
                    self.by_attr.setdefault(name, []).append(v)

    def _special(self, v, what) -> bool:
        """Register what stands in for ``v`` (``process_state.py``), or note that it cannot be
        guarded; True when nothing else is to be done for ``v``."""
        if v is sys.modules:  # guarded entry by entry where it is read (reads.py)
            return True
        inner = process_state.stand_in(v)
        if inner is not None:
            self.known[id(v)] = (v, what)
            self.register(inner, what)
            return True
        reason = process_state.unguardable(v)
        if reason is not None:
            self.known[id(v)] = (v, what)
            self.unguarded = self.unguarded or what
            return True
        entries = process_state.cache_entries(v)
        if entries is not None:
            self.caches.append((entries, what))
        return False

    def changes(self) -> list[str]:
        """What the call changed in the objects it reached (each replaced deferred value too)."""
        found = []
        for obj, snap, what, own in self.snapshots:
            if own:  # an object's own attributes
                if not same_contents(attributes(obj), snap):
                    found.append(f"changes {what} during the call")
                    effects.materialize_attributes(obj)
            elif not same_contents(obj, snap):
                found.append(f"changes {what} during the call")
                effects.materialize_items(obj)
        return found


def outside_of(head: str, what: str) -> str:
    """``head of what``, with a long chain of owners cut to its first and last two."""
    parts = what.split(" of ")
    if len(parts) > 3:
        what = " of ".join([parts[0], "...", *parts[-2:]])
    return f"{head} of {what}"


def named(obj) -> str:
    """A short description of an object for messages: its module, class or type."""
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, type):
        return f"class {obj.__qualname__}"
    return f"a {type(obj).__name__} object"
