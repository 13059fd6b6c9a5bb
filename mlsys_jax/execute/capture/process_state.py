"""State a read reaches that is not a Python object's attributes or items: the process
environment, context variables, thread-local data, C buffers, caches — and how capture guards it.

A replay that skipped such a read would return what it held when the call was recorded, so each
kind is either guarded by its contents (``state_guards.contents_of``: compared on every warm
call) or, where capture cannot read all of it, makes the calls run eagerly with the reason:

- ``os.environ`` (and ``os.getenv``, which reads it): the dict it mirrors the environment in,
  by its items — what Python reads;
- a ``types.MappingProxyType``: the mapping it wraps (found through the garbage collector's
  referents, as C code reaches it), by its items;
- ``bytearray``, ``array.array``: their bytes;
- ``contextvars.ContextVar``: its value in the calling context; ``threading.local``: the calling
  thread's attributes — both read again on every warm call, in the calling context and thread;
- an ``functools.lru_cache`` of the user's function: its entries (the dict C code keeps them
  in) as the recording left them — a hit returns what it holds; ``cache_clear``, a new entry or
  an eviction changes them (:func:`cache_entries`);
- ctypes objects, ``memoryview``, ``mmap``: memory that C code and pointers reach: not guarded,
  calls run eagerly (:func:`unguardable`).
"""
from __future__ import annotations

import array
import contextvars
import ctypes
import functools
import gc
import mmap
import os
import sys
import threading
import types

from mlsys_jax.execute.capture.state_guards import instance_dict
from mlsys_jax.execute.capture.watching import immutable

_CDATA = ctypes.c_int.__mro__[-2]  # _ctypes._CData: every ctypes object
CONTENTS = (bytearray, array.array, contextvars.ContextVar, threading.local)
_UNGUARDABLE = {_CDATA: "a ctypes object", memoryview: "a memoryview", mmap.mmap: "an mmap"}
_LRU = functools._lru_cache_wrapper
# id -> (the object, the environ mapping it reads): os.environ, os.getenv (and the bytes twins)
_ENVIRON = {id(o): (o, env) for o, env in [(os.environ, os.environ), (os.getenv, os.environ)] + (
    [(os.environb, os.environb), (os.getenvb, os.environb)] if hasattr(os, "environb") else [])}
_KINDS: dict = {}  # type -> whether its objects are special here


def _environ(v):
    """The environ mapping ``v`` is or reads (``os.getenv`` reads ``os.environ``), or None."""
    known = _ENVIRON.get(id(v))
    return known[1] if known is not None and known[0] is v else None


def special(v) -> bool:
    """Whether ``v`` is one of the objects this module knows (checked on every watched read: a
    lookup by type, computed once per type)."""
    if id(v) in _ENVIRON or v is sys.modules:
        return True
    t = type(v)
    kind = _KINDS.get(t)
    if kind is None:
        if len(_KINDS) > 4096:
            _KINDS.clear()
        kind = _KINDS[t] = issubclass(t, (*CONTENTS, *_UNGUARDABLE, _LRU, types.MappingProxyType))
    return kind


def watched_read(v) -> bool:
    """Whether a read's value is one to register where it is read (``reads.py``): an lru_cache
    only when it is the user's."""
    return special(v) and (not isinstance(v, _LRU) or user_cache(v))


def stand_in(v):
    """What is guarded for ``v`` in its place (None: ``v`` itself): the dict ``os.environ``
    keeps its items in, the mapping a mappingproxy wraps."""
    environ = _environ(v)
    if environ is not None:
        return environ._data  # (os.environb's is the same dict)
    if isinstance(v, types.MappingProxyType):
        inner = [r for r in gc.get_referents(v) if isinstance(r, dict)]
        return inner[0] if len(inner) == 1 else None
    return None


def describe(v) -> str:
    """How a message names ``v``: ``os.environ``, ``ContextVar 'mode'``, ``a bytearray``."""
    environ = _environ(v)
    if environ is not None:
        return "os.environ" if environ is os.environ else "os.environb"
    if isinstance(v, contextvars.ContextVar):
        return f"ContextVar {v.name!r}"
    if isinstance(v, _LRU):
        return f"the lru_cache of {getattr(v, '__qualname__', '?')}"
    kind = unguardable(v)
    if kind is not None:
        return kind
    name = {threading.local: "threading.local", types.MappingProxyType: "mappingproxy",
            array.array: "array.array"}.get(type(v), type(v).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def unguardable(v) -> str | None:
    """What ``v`` is, where capture cannot guard it (its state is memory C code reaches: a
    ctypes object, a memoryview, an mmap; a mappingproxy over something other than a dict)."""
    for t, said in _UNGUARDABLE.items():
        if isinstance(v, t):
            return f"{said} ({type(v).__name__})" if t is _CDATA else said
    if isinstance(v, types.MappingProxyType) and stand_in(v) is None:
        return "a mappingproxy over a mapping capture cannot read"
    return None


def user_cache(v) -> bool:
    """Whether ``v`` is an ``lru_cache`` of a function of the user's (JAX's and the standard
    library's caches are theirs)."""
    inner = (instance_dict(v) or {}).get("__wrapped__")
    return isinstance(v, _LRU) and isinstance(inner, types.FunctionType) and not immutable(inner)


def cache_entries(v) -> dict | None:
    """The dict an ``lru_cache`` of the user's keeps its entries in (None: not one, or one that
    keeps none, ``maxsize=0``). C code holds it; the garbage collector's referents reach it.
    Each entry is the result (unbounded) or a new link per insertion, so a ``cache_clear`` and a
    new result, or an eviction, change its items' identities; a hit changes nothing."""
    if not user_cache(v):
        return None
    own = instance_dict(v)
    found = [r for r in gc.get_referents(v) if type(r) is dict and r is not own]
    return found[0] if len(found) == 1 else None
