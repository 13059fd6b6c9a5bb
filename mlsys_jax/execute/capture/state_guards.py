"""Guards on what the captured Python read from outside its arguments (Dynamo's guards).

torch.compile guards a compiled frame on what the frame read: globals (``G['x']``), closure
cells, attributes — Python constants by value (``CONSTANT_MATCH``), modules, functions and
other objects by identity (``ID_MATCH``, ``FUNCTION_MATCH``). A cold run here records the same
(``reads.py`` observes the reads): each is a :class:`StateGuard`, the place read from and what it
held. By value: Python scalars, strings and tuples of them (floats by bit pattern, as break keys
are). By identity: everything else — a JAX array (immutable, so the same object is the same
value), a module, a function, an object whose own attributes are guarded where they are read.
By contents: a NumPy array (mutable in place: compared with a copy, a copy's cost, what eager pays
converting it each call) and a list, dict or set read from outside (its items, by identity).
Plus JAX's float64 switch, which changes the dtypes a recording makes.

A warm call checks every guard of its tree with one generated function (:func:`compile_check`,
one ``and`` chain of dictionary lookups); where one fails, the Python would now run differently,
so the call records again and ``explain()`` names the guard (:func:`first_failure`).
"""
from __future__ import annotations

import array
import collections
import contextvars
import functools
import operator
import threading
import types
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from mlsys_jax.compat import X64_STATE, x64_enabled
from mlsys_jax.execute.capture.break_guards import value_key

MISSING = object()  # what a place holds when it holds nothing (a deleted global, an empty cell)
UNKNOWN = object()  # a value that cannot be read without running code
_SCALARS = (bool, int, float, complex, str, bytes, type(None))


def by_value(v) -> bool:
    """Whether a read value is guarded by value (Python scalars, strings, tuples of them)."""
    if type(v) in _SCALARS or isinstance(v, np.generic):
        return True
    return type(v) in (tuple, frozenset) and len(v) <= 64 and all(map(by_value, v))


def _cell(c):
    try:
        return c.cell_contents
    except ValueError:
        return MISSING


def read_slot(obj, descriptor):
    """The value of a ``__slots__`` member, read by its C descriptor (MISSING if unset)."""
    try:
        return descriptor.__get__(obj, type(obj))
    except AttributeError:
        return MISSING


def instance_dict(obj):
    """An object's own ``__dict__`` (None if it has none), found without running its code."""
    try:
        d = object.__getattribute__(obj, "__dict__") if not isinstance(obj, threading.local) \
            else _thread_dict(obj)  # (the calling thread's)
    except (AttributeError, TypeError):
        return None
    return d if isinstance(d, dict) else None


def attributes(obj) -> dict:
    """An object's own attributes: its ``__dict__`` and its slots."""
    out = dict(instance_dict(obj) or {})
    for k in type(obj).__mro__:
        for name, d in k.__dict__.items():
            if isinstance(d, types.MemberDescriptorType) and name not in out:
                out[name] = read_slot(obj, d)
    return out


def _same_list(now, then: tuple) -> bool:
    return len(now) == len(then) and all(map(operator.is_, now, then))


def _same_dict(now, then: dict) -> bool:
    return len(now) == len(then) and all(now.get(k, MISSING) is v for k, v in then.items())


def _array_bytes(a) -> tuple:
    a = np.ascontiguousarray(a)
    return a.shape, a.dtype.str, a.reshape(-1).view(np.uint8).tobytes()


def _thread_dict(local) -> dict:
    """A ``threading.local``'s attributes in the calling thread (its C ``__getattribute__``:
    ``object``'s does not find them)."""
    return threading.local.__getattribute__(local, "__dict__")


def contents_of(obj):
    """A snapshot of a container's items (a list, deque, dict or set; by identity), of a NumPy
    array's, a bytearray's or an ``array.array``'s bytes, of a ``ContextVar``'s value in this
    context or of a ``threading.local``'s attributes in this thread (``process_state.py``)."""
    if isinstance(obj, np.ndarray):
        return _array_bytes(obj)
    if isinstance(obj, (list, collections.deque)):
        return tuple(obj)
    if isinstance(obj, dict):
        return dict(obj)
    if isinstance(obj, (bytearray, array.array)):
        return getattr(obj, "typecode", None), bytes(obj)
    if isinstance(obj, contextvars.ContextVar):
        v = obj.get(MISSING)
        return ("value", value_key(v)) if by_value(v) else ("object", v)
    if isinstance(obj, threading.local):
        return dict(_thread_dict(obj))
    return frozenset(obj)  # a set: its items are hashable values


def same_contents(obj, then) -> bool:
    """Whether a mutable container still holds what a cold run saw (``then``, as recorded)."""
    if isinstance(obj, np.ndarray):
        return _array_bytes(obj) == then
    if isinstance(obj, (list, collections.deque)):
        return _same_list(obj, then)
    if isinstance(obj, dict):
        return _same_dict(obj, then)
    if isinstance(obj, threading.local):
        return _same_dict(_thread_dict(obj), then)
    if isinstance(obj, contextvars.ContextVar):
        now = contents_of(obj)
        return now[1] is then[1] if now[0] == "object" else now == then
    return contents_of(obj) == then if isinstance(obj, (bytearray, array.array)) else obj == then


# kind -> the expression reading the place from holder h and key k, in the generated check (a
# missing key or an empty cell raises there: the check then fails, as it should)
_READ = {"entry": "{h}[{k}]", "cell": "{h}.cell_contents", "slot": "{k}.__get__({h})"}
_SAFE_READ = {"entry": "{h}.get({k}, _M)", "cell": "_cell({h})", "slot": "read_slot({h}, {k})"}


@dataclass(frozen=True, eq=False)
class StateGuard:
    """One guarded read: ``kind`` says how ``holder`` and ``key`` name the place (``entry``: a
    mapping's key — a global, an attribute in an object's ``__dict__``; ``cell``: a closure cell;
    ``slot``: an object's ``__slots__`` member, ``key`` its descriptor;
    ``contents``: a container or NumPy array as a whole; ``x64``). A ``latest`` guard is on
    state the recording itself changes (an ``lru_cache``'s entries): what it held at the end of
    the latest cold run is what it must hold."""

    what: str  # what was read, as explain() names it: "global 'SCALE'"
    where: str  # file:line of the first read
    kind: str
    holder: Any
    key: Any
    expected: Any  # the object (identity), its value_key (by value), or a snapshot (contents)
    value: bool = False
    latest: bool = False

    def now(self):
        """What the place holds now (for the contents and x64 kinds: the state itself)."""
        if self.kind == "contents":
            return self.holder
        if self.kind == "x64":
            return x64_enabled()
        return {"entry": lambda: self.holder.get(self.key, MISSING), "cell": lambda: _cell(
            self.holder), "slot": lambda: read_slot(self.holder, self.key)}[self.kind]()

    def holds(self) -> bool:
        """Whether the place still holds what the cold run saw (unreadable counts as changed)."""
        try:
            if self.kind == "contents":
                return same_contents(self.holder, self.expected)
            if self.kind == "x64":
                return x64_enabled() == self.expected
            v = self.now()
            return value_key(v) == self.expected if self.value else v is self.expected
        except Exception:  # noqa: BLE001 - a place that cannot be read no longer holds it
            return False

    def failure(self) -> str:
        """Why the guard fails now, for explain(): what was read, where, then and now."""
        if self.kind in ("contents", "x64"):
            return f"{self.what} (read at {self.where}) changed"

        now = self.now()
        said = "no longer exists" if now is MISSING else f"is now {_short(now)}"
        was = _short(self.expected[1]) if self.value and len(self.expected) == 2 else "another object"
        return f"{self.what} (read at {self.where}) was {was}, {said}"


def _short(v) -> str:
    if isinstance(v, bytes) and len(v) == 8:  # a float's bit pattern (value_key)
        return repr(np.frombuffer(v, "<f8")[0].item())
    name = type(v).__name__
    text = repr(v) if type(v) in _SCALARS else f"{'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"
    return text if len(text) <= 60 else text[:57] + "..."


def compile_check(guards: list[StateGuard], then: Callable | None = None,
                  miss=None) -> Callable | None:
    """One function checking every guard (None when there are none): ``and`` over one
    expression per guard, generated as a closure over the places (cell reads: nothing is bound
    per call) so that a warm call pays about a dictionary lookup per read. With ``then``, the
    function takes ``then``'s arguments and returns ``then(*args)`` when every guard holds, else
    ``miss``."""
    if not guards:
        return then
    ns = {"_M": MISSING, "_cell": _cell, "read_slot": read_slot, "_vk": value_key,
          "_X": X64_STATE,
          "_same": same_contents, "_then": then, "_miss": miss}
    terms = []
    for i, g in enumerate(guards):
        h, k, e = f"h{i}", f"k{i}", f"e{i}"
        ns[h], ns[k], ns[e] = g.holder, g.key, g.expected
        if g.kind == "contents":
            terms.append(f"_same({h}, {e})")
        elif g.kind == "x64":
            terms.append(f"_X.value is {e}")
        elif g.expected is MISSING and not g.value:
            terms.append(_SAFE_READ[g.kind].format(h=h, k=k) + " is _M")
        else:
            read = _READ[g.kind].format(h=h, k=k)
            terms.append(f"_vk({read}) == {e}" if g.value else f"{read} is {e}")
    body = " and ".join(terms)
    if then is None:
        inner = ("    def check():\n        try:\n            return " + body +
                 "\n        except Exception:\n            return False\n")
    else:
        inner = ("    def check(*args):\n        try:\n            ok = " + body +
                 "\n        except Exception:\n            ok = False\n"
                 "        return _then(*args) if ok else _miss\n")
    source = f"def make({', '.join(ns)}):\n{inner}    return check\n"
    scope: dict = {}
    exec(_compiled(source), scope)  # noqa: S102 - our own expressions
    return scope["make"](**ns)


@functools.lru_cache(maxsize=1024)
def _compiled(source: str):
    """A check's code, compiled once per shape of guard list (the values are arguments)."""
    return compile(source, "<capture guards>", "exec")


def first_failure(guards: list[StateGuard]) -> StateGuard | None:
    """The first guard that no longer holds (None if all do)."""
    return next((g for g in guards if not g.holds()), None)
