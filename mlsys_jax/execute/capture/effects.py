"""Python side effects that a replay would skip, and deferred values stored outside a call.

A warm call replays compiled programs without running the Python, so anything the Python does
besides computing its result would happen once instead of every call. ``reads.py`` sees changes
to what the call read from outside; this module knows the calls that act on the world:
``print``, ``input``, ``open``, ``breakpoint``, file and stream methods, logging, the clock, and
the global random generators of Python and NumPy (a draw changes their state).

A deferred value stored outside during the recording (``log.append(y)``, ``self.h = y``, a
global) would be a tracer left in the user's data; where the place is a list, a dict, an object's
attribute, a global or a closure cell, :func:`materialize_items` / :func:`materialize_place`
put the concrete array there instead, as eager would have.
"""
from __future__ import annotations

import builtins
import io
import logging
import random
import time
import types

import numpy as np

from mlsys_jax.execute.capture.state_guards import instance_dict

EFFECT_TYPES = (random.Random, np.random.RandomState, np.random.Generator, io.IOBase,
                logging.Logger, logging.Handler)
_TABLE: dict = {}  # id -> (object, what calling it does); objects kept so their ids stay theirs


def _table() -> dict:
    if not _TABLE:
        named = [(builtins, n) for n in ("print", "input", "open", "breakpoint")]
        named += [(time, n) for n in ("time", "time_ns", "perf_counter", "perf_counter_ns",
                                      "monotonic", "monotonic_ns", "process_time", "sleep")]
        named += [(logging, n) for n in ("debug", "info", "warning", "warn", "error", "critical",
                                         "exception", "log")]
        named += [(random, n) for n in dir(random) if getattr(getattr(random, n), "__self__",
                                                              None) is random._inst]
        legacy = np.random.mtrand._rand
        named += [(np.random, n) for n in dir(np.random)
                  if getattr(getattr(np.random, n), "__self__", None) is legacy]
        for module, name in named:
            v = getattr(module, name)
            _TABLE[id(v)] = (v, f"{module.__name__}.{name}()")
    return _TABLE


def effect_of(v) -> str | None:
    """What calling ``v`` does to the world (``"builtins.print()"``), or None."""
    known = _table().get(id(v))
    if known is not None and known[0] is v:
        return known[1]
    owner = getattr(v, "__self__", None) if isinstance(
        v, (types.MethodType, types.BuiltinMethodType)) else None
    if isinstance(owner, EFFECT_TYPES):
        return f"{type(owner).__name__}.{getattr(v, '__name__', '?')}()"
    return None


def _concrete(v, depth: int = 0):
    """``v`` with deferred values replaced by their arrays (in lists and dicts, in place)."""
    from mlsys_jax.execute.capture.recording import DeferredTracer

    if isinstance(v, DeferredTracer):
        return v.val if v.val is not None else v
    if depth < 3 and type(v) in (list, dict):
        materialize_items(v, depth + 1)
    return v


def materialize_items(container, depth: int = 0) -> None:
    """Replace deferred values among a list's or dict's items (an object's ``__dict__``)."""
    if type(container) is list:
        for i, item in enumerate(container):
            container[i] = _concrete(item, depth)
    elif type(container) is dict:
        for k, item in list(container.items()):
            container[k] = _concrete(item, depth)


def materialize_attributes(obj) -> None:
    """Replace deferred values among an object's own attributes (``__dict__`` and slots)."""
    inst = instance_dict(obj)
    if inst is not None:
        materialize_items(inst)
    for k in type(obj).__mro__:
        for d in k.__dict__.values():
            if isinstance(d, types.MemberDescriptorType):
                try:
                    d.__set__(obj, _concrete(d.__get__(obj, type(obj))))
                except (AttributeError, TypeError):
                    pass


def materialize_place(holder, key) -> None:
    """Replace a deferred value held at a mapping's ``key`` (a global) or in a cell (key None)."""
    try:
        if key is None:
            holder.cell_contents = _concrete(holder.cell_contents)
        elif isinstance(holder, dict) and key in holder:
            holder[key] = _concrete(holder[key])
    except (ValueError, TypeError):  # an empty cell, a read-only mapping: nothing to replace
        pass
