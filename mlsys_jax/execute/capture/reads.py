"""What the captured Python reads and changes outside its arguments, watched while it records.

Dynamo knows every read because it interprets a frame's bytecode itself; capture runs the real
Python, so during a cold run it watches it. ``sys.settrace`` delivers an event before each
instruction of a *watched* frame — the user's code and the libraries that keep state (flax,
haiku, equinox, keras...); JAX, NumPy, the standard library and capture itself are not watched,
and capture's own handlers switch tracing off (``untraced``), so a cold run costs about what it
did. At each instruction that reads outside the call:

- ``LOAD_GLOBAL``, ``LOAD_DEREF`` (a closure cell of a function made before the call): a guard on
  that global or cell (``state_guards.py``);
- ``LOAD_ATTR`` / ``LOAD_METHOD`` / ``BINARY_SUBSCR`` on an object from outside — found from the
  instruction before (``self.w``, ``self.layer.w``, ``CFG['k']``), or else every object from
  outside that has that attribute: a guard on the attribute where the object keeps it (its
  ``__dict__``, or its class's) — read statically, never running a property or ``__getattr__``,
  whose own Python is watched instead.

Objects come "from outside" when read from a global, a closure, another outside object, or are
the captured callable itself (its ``self``, its defaults) or a static argument. Each is kept with
a snapshot (a list's items, an object's ``__dict__``, a NumPy array's bytes); after the call a
snapshot that differs, a global or closure variable written, or a call to ``print``, a file, a
logger, the clock or a global random generator is a *side effect*: warm calls replay compiled
programs without the Python, so the caller runs such functions eagerly (:meth:`ReadWatch.finish`
also puts concrete arrays where a deferred value was stored, as eager would have).
"""
from __future__ import annotations

import dis
import functools
import gc
import os
import sys
import sysconfig
import types

import jax
import numpy as np

from mlsys_jax.compat import Tracer, x64_enabled
from mlsys_jax.execute.capture import effects
from mlsys_jax.execute.capture.break_guards import value_key
from mlsys_jax.execute.capture.state_guards import (MISSING, StateGuard, attributes, by_value,
                                                    contents_of, instance_dict, read_slot,
                                                    same_contents)

_LIBRARIES = ("/jax/", "/jaxlib/", "/numpy/", "/scipy/", "/ml_dtypes/", "/opt_einsum/",
              "/optax/", "/mlsys_jax/execute/", "<frozen ")
_STDLIB = sysconfig.get_paths()["stdlib"]
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
MAX_CONTAINER = 1024  # items a container read from outside is guarded by, one by one
MAX_REGISTERED = 8192  # objects from outside one cold run keeps (items of containers included)
UNKNOWN = object()
_LOCAL_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLOSURE")
_CHAINED = ("LOAD_ATTR", "LOAD_METHOD", "BINARY_SUBSCR")
_HANDLED = {"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_ATTR", "LOAD_METHOD",
            "BINARY_SUBSCR", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF",
            "STORE_ATTR", "DELETE_ATTR", "MAKE_FUNCTION"}


def watched_file(filename: str) -> bool:
    """Whether frames of this file are watched (not JAX, NumPy, the standard library, capture)."""
    if any(s in filename for s in _LIBRARIES):
        return False
    return not (filename.startswith(_STDLIB) and "site-packages" not in filename)


_KINDS: dict = {}  # code -> what its frames are: None (not watched), "user" or "library"


def frame_kind(frame) -> str | None:
    """None for a frame that is not watched, else whose code it runs: ``"library"`` (an
    installed package: flax, haiku, keras...) or ``"user"``. Generated code (``<string>``:
    dataclasses' ``__init__``, namedtuples' ``__new__``, the user's ``exec``) belongs to the
    module whose globals it runs in."""
    code = frame.f_code
    kind = _KINDS.get(code, False)
    if kind is False:
        name = code.co_filename
        if name.startswith("<") and not name.startswith("<frozen"):
            module = frame.f_globals.get("__name__")
            named = isinstance(module, str)
            name = getattr(sys.modules.get(module), "__file__", None) if named else None
            if named and module.startswith("namedtuple_"):
                name = _STDLIB
        kind = None if name is not None and not watched_file(name) else \
            "library" if name is not None and any(s in name for s in _INSTALLED) else "user"
        if len(_KINDS) > 65536:
            _KINDS.clear()
        _KINDS[code] = kind
    return kind


def untraced(fn, *args):
    """``fn(*args)`` with tracing off (capture's own work during a cold run is not watched)."""
    tracer = sys.gettrace()
    if tracer is None:
        return fn(*args)
    sys.settrace(None)
    try:
        return fn(*args)
    finally:
        sys.settrace(tracer)


class _Instr:
    __slots__ = ("op", "name", "offset", "pred", "pred2")

    def __init__(self, ins, pred, pred2):
        self.op, self.name, self.offset = ins.opname, ins.argval, ins.offset
        self.pred, self.pred2 = pred, pred2  # (op, argval, offset) of the instructions before


_TABLES: dict = {}


def _table(code) -> dict:
    """offset -> _Instr for the instructions of ``code`` the watch handles (cached per code)."""
    table = _TABLES.get(code)
    if table is None:
        table, seq = {}, [i for i in dis.get_instructions(code)
                          if i.opname not in ("EXTENDED_ARG", "NOP", "CACHE")]
        for n, ins in enumerate(seq):
            if ins.opname in _HANDLED:
                before = [None if ins.is_jump_target or n < k + 1 or (k and seq[n - k].is_jump_target)
                          else (seq[n - k - 1].opname, seq[n - k - 1].argval, seq[n - k - 1].offset)
                          for k in (0, 1)]
                table[ins.offset] = _Instr(ins, *before)
        if len(_TABLES) > 4096:
            _TABLES.clear()
        _TABLES[code] = table
    return table


def static_attr(obj, name):
    """(value or UNKNOWN, [(kind, holder, key, held)]): ``obj.name`` found without running
    code, and the places that decide it (an instance's own entry or slot, or its absence and the
    class's entry). A property's value is UNKNOWN: its getter runs, and is watched."""
    mro = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
    owner = next((k for k in mro if name in k.__dict__), None)
    found = owner.__dict__[name] if owner is not None else MISSING
    if isinstance(obj, type):
        return (UNKNOWN, []) if owner is None else (found, [("entry", owner.__dict__, name, found)])
    places = [] if owner is None else [("entry", owner.__dict__, name, found)]
    if isinstance(found, types.MemberDescriptorType):  # a slot: read by its C descriptor
        held = read_slot(obj, found)
        return (UNKNOWN if held is MISSING else held), [("slot", obj, found, held)]
    if found is not MISSING and hasattr(type(found), "__set__"):  # a property, a C getter
        return UNKNOWN, places
    inst = instance_dict(obj)
    if inst is not None and name in inst:
        return inst[name], [("entry", inst, name, inst[name])]
    if found is MISSING:
        return UNKNOWN, []  # __getattr__: its Python is watched
    return found, places + ([("entry", inst, name, MISSING)] if inst is not None else [])




class ReadWatch:
    """Watches one cold run: ``with watch: fn(...)``, then :meth:`finish` for the side effects;
    ``guards`` holds the reads (``StateGuard``), in the order they were first made."""

    def __init__(self, fn, static_leaves=()):
        self.guards: dict = {"x64": StateGuard("JAX's float64 setting (jax_enable_x64)", "the call",
                                               "x64", None, None, x64_enabled())}
        self.outside: dict = {}  # id -> (object, what it was read as)
        self.snapshots: list = []  # (object, snapshot, what)
        self.writes: dict = {}  # (id(holder), key) -> (holder, key, held before, what, where)
        self.by_code: dict = {}  # code -> functions from outside with that code
        self.by_attr: dict = {}  # attribute name -> outside objects holding it in __dict__
        self.made: set = set()  # code objects of functions made during the call
        self.searched: set = set()
        self.last: dict = {}  # id(frame) -> (code, offset, value) of its last chained read
        self.effects: list[str] = []
        self.broken: str | None = None
        self._prev = None
        self._register(fn, "the captured function")
        for f in (fn, getattr(fn, "__func__", None)):
            for i, v in enumerate(getattr(f, "__defaults__", None) or ()):
                self._register(v, f"default argument {i + 1} of {getattr(f, '__qualname__', f)}")
            for k, v in (getattr(f, "__kwdefaults__", None) or {}).items():
                self._register(v, f"default argument {k!r} of {getattr(f, '__qualname__', f)}")
        for i, v in enumerate(static_leaves):
            self._register(v, f"static argument {i + 1}")

    # ---- tracing ------------------------------------------------------------------------------
    def __enter__(self):
        self._prev = sys.gettrace()
        sys.settrace(self._call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._prev)

    def _call(self, frame, event, arg):
        theirs = self._prev(frame, event, arg) if self._prev is not None else None
        if frame_kind(frame) is None:
            return theirs
        frame.f_trace_opcodes = True
        if theirs is None:
            return self._event

        def both(frame, event, arg):
            nonlocal theirs
            theirs = theirs(frame, event, arg) if theirs is not None else None
            self._event(frame, event, arg)
            return both
        return both

    def _event(self, frame, event, arg):
        if event == "opcode":
            ins = _table(frame.f_code).get(frame.f_lasti)
            if ins is not None:
                try:
                    getattr(self, "_" + ins.op.lower())(frame, ins)
                except Exception as e:  # noqa: BLE001 - never break the user's code
                    self.broken = self.broken or f"{type(e).__name__}: {e}"
        elif event == "return":
            self.last.pop(id(frame), None)
        return self._event

    # ---- reads --------------------------------------------------------------------------------
    def _load_global(self, frame, ins):
        g = frame.f_globals
        v = g.get(ins.name, MISSING)
        if v is MISSING:  # a builtin: not guarded, but print() & co. are side effects
            self._effect(frame, frame.f_builtins.get(ins.name))
            return
        if _KINDS.get(frame.f_code) == "library":  # a library's own state is the library's
            self._loaded(frame, ins, v)
            return
        module = g.get("__name__")
        self._guard(frame, "entry", g, ins.name, v, f"global {ins.name!r}"
                    + (f" of {module}" if isinstance(module, str) else ""))
        self._loaded(frame, ins, v)

    def _load_deref(self, frame, ins):
        cell = self._cell(frame, ins.name)
        v = frame.f_locals.get(ins.name, MISSING)
        if cell is not None:
            self._guard(frame, "cell", cell, None, v, f"closure variable {ins.name!r} of "
                        f"{frame.f_code.co_qualname}")
        self._loaded(frame, ins, v)

    _load_classderef = _load_deref

    def _load_attr(self, frame, ins):
        obj = self._operand(frame, ins.pred)
        if obj is UNKNOWN:  # every outside object that holds the attribute is guarded on it
            for holder in self.by_attr.get(ins.name, ()):
                v, places = static_attr(holder, ins.name)
                self._guard_places(frame, holder, ins.name, places)
            return
        v, places = static_attr(obj, ins.name)
        if id(obj) in self.outside:
            self._guard_places(frame, obj, ins.name, places)
        if isinstance(obj, effects.EFFECT_TYPES):
            self._effect_note(frame, f"calls {type(obj).__name__}.{ins.name}()")
        if v is not UNKNOWN:
            self._loaded(frame, ins, v)

    _load_method = _load_attr

    def _binary_subscr(self, frame, ins):
        key = self._operand(frame, ins.pred)
        obj = self._operand(frame, ins.pred2) if key is not UNKNOWN else UNKNOWN
        if type(obj) not in (dict, list, tuple) or id(obj) not in self.outside:
            return  # (a subclass's __getitem__ may be Python: it is watched itself)
        try:
            v = obj[key] if type(obj) is dict else obj[key] if type(key) is int else UNKNOWN
        except (KeyError, IndexError, TypeError):
            return
        if len(obj) > MAX_CONTAINER and type(obj) is not tuple:  # no contents guard: the item's
            self._guard(frame, "entry" if type(obj) is dict else "index", obj, key, v,
                        _of(f"item {key!r}", self.outside[id(obj)][1]))
        if v is not UNKNOWN:
            self._loaded(frame, ins, v)

    def _loaded(self, frame, ins, v):
        self.last[id(frame)] = (frame.f_code, ins.offset, v)
        self._effect(frame, v)

    def _operand(self, frame, pred):
        """The object an instruction works on, from the instruction that pushed it."""
        if pred is None:
            return UNKNOWN
        op, arg, offset = pred
        if op in _LOCAL_LOADS:
            return frame.f_locals.get(arg, UNKNOWN)
        if op == "LOAD_GLOBAL":
            v = frame.f_globals.get(arg, MISSING)
            return frame.f_builtins.get(arg, UNKNOWN) if v is MISSING else v
        if op == "LOAD_CONST":
            return arg
        if op in _CHAINED:
            code, at, v = self.last.get(id(frame), (None, None, UNKNOWN))
            return v if code is frame.f_code and at == offset else UNKNOWN
        return UNKNOWN

    def _cell(self, frame, name):
        """The closure cell a frame reads ``name`` from, when its function was made before the
        call (None: a cell of this call, or not a free variable)."""
        code = frame.f_code
        if name not in code.co_freevars:
            return None
        for attempt in range(2):
            for fn in self.by_code.get(code, ()):
                cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
                if all(_contents(c) is frame.f_locals.get(n, MISSING) for n, c in cells.items()):
                    return cells[name]
            if code in self.made or attempt or code in self.searched \
                    or _KINDS.get(code) == "library":  # a library's closures are the library's
                break
            self.searched.add(code)  # a function reached another way: find it once
            for ref in gc.get_referrers(code):
                if isinstance(ref, types.FunctionType) and ref.__code__ is code:
                    self._register(ref, f"function {ref.__qualname__}")
        if code not in self.made and _KINDS.get(code) != "library":
            self.broken = self.broken or (f"a closure variable {name!r} of {code.co_qualname} "
                                          "whose function capture cannot find")
        return None

    def _guard_places(self, frame, obj, name, places):
        what = _of(f"attribute {name!r}", self.outside.get(id(obj), (None, _named(obj)))[1])
        for kind, holder, key, held in places:
            self._guard(frame, kind, holder, key, held, what)

    def _guard(self, frame, kind, holder, key, v, what):
        k = (kind, id(holder), key)
        if k in self.guards or isinstance(v, Tracer):
            return
        where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        value = by_value(v)
        expected = value_key(v) if value else v
        self.guards[k] = StateGuard(what, where, kind, holder, key, expected, value)
        self._register(v, what)

    # ---- objects from outside -----------------------------------------------------------------
    def _register(self, v, what):
        if id(v) in self.outside or len(self.outside) >= MAX_REGISTERED or _immutable(v):
            return
        self.outside[id(v)] = (v, what)
        if isinstance(v, types.FunctionType):
            self.by_code.setdefault(v.__code__, []).append(v)
        if isinstance(v, types.MethodType):  # a bound method: its object and its function
            self._register(v.__self__, what)
            self._register(v.__func__, what)
        elif isinstance(v, functools.partial):
            for part in (v.func, *v.args, *v.keywords.values()):
                self._register(part, what)
        for part in ("__wrapped__", "fun"):  # functools.wraps, jax.jit, custom_jvp keep the function
            inner = instance_dict(v).get(part, UNKNOWN) if instance_dict(v) is not None \
                else UNKNOWN
            if inner is not UNKNOWN and callable(inner):
                self._register(inner, what)
        container = isinstance(v, (list, dict, set))
        if isinstance(v, np.ndarray) or container:
            snap = contents_of(v)
            self.snapshots.append((v, snap, what, False))
            if isinstance(v, np.ndarray) or len(v) <= MAX_CONTAINER:
                self.guards[("contents", id(v), None)] = StateGuard(
                    f"the contents of {what}", "the call", "contents", v, None, snap)
        if isinstance(v, dict):
            for key, item in list(v.items())[:MAX_CONTAINER]:
                self._register(item, _of(f"item {key!r}", what))
        elif container or type(v) is tuple:
            for i, item in enumerate(list(v)[:MAX_CONTAINER]):
                self._register(item, _of(f"item {i}", what))
        if not isinstance(v, (types.ModuleType, type, np.ndarray, tuple)):
            own = attributes(v)  # a container's too: a subclass may keep attributes
            if own:
                self.snapshots.append((v, own, f"the attributes of {what}", True))
                for name in own:
                    self.by_attr.setdefault(name, []).append(v)

    # ---- writes and side effects --------------------------------------------------------------
    def _store_global(self, frame, ins):
        if _KINDS.get(frame.f_code) != "library":
            self._write(frame, frame.f_globals, ins.name, f"global {ins.name!r}")

    _delete_global = _store_global

    def _store_deref(self, frame, ins):
        cell = self._cell(frame, ins.name)
        if cell is not None:
            self._write(frame, cell, None, f"closure variable {ins.name!r}")

    _delete_deref = _store_deref

    def _store_attr(self, frame, ins):
        # an object's own attributes are in its snapshot; a module's or a class's are written here
        obj = self._operand(frame, ins.pred)
        if obj is not UNKNOWN and id(obj) in self.outside \
                and isinstance(obj, (types.ModuleType, type)):
            self._write(frame, obj.__dict__, ins.name, f"attribute {ins.name!r} of {_named(obj)}")

    _delete_attr = _store_attr

    def _make_function(self, frame, ins):
        if ins.pred is not None and isinstance(ins.pred[1], types.CodeType):
            self.made.add(ins.pred[1])

    def _write(self, frame, holder, key, what):
        k = (id(holder), key)
        if k not in self.writes:
            held = _contents(holder) if key is None else holder.get(key, MISSING)
            self.writes[k] = (holder, key, held, what, f"{frame.f_code.co_filename}:"
                              f"{frame.f_lineno}")

    def _effect(self, frame, v):
        said = effects.effect_of(v)
        if said:
            self._effect_note(frame, f"calls {said}")

    def _effect_note(self, frame, said):
        self.effects.append(f"{said} at {frame.f_code.co_filename}:{frame.f_lineno}")

    def finish(self) -> list[str]:
        """After the call: the side effects (what changed outside, or was called), each with
        where; deferred values stored outside are replaced by their concrete arrays."""
        self.last.clear()
        found = list(self.effects)
        for holder, key, held, what, where in self.writes.values():
            now = _contents(holder) if key is None else holder.get(key, MISSING)
            if now is not held:
                found.append(f"writes {what} at {where}")
                effects.materialize_place(holder, key)
        for obj, snap, what, own in self.snapshots:
            if own:  # an object's own attributes
                if not same_contents(attributes(obj), snap):
                    found.append(f"changes {what} during the call")
                    effects.materialize_attributes(obj)
            elif not same_contents(obj, snap):
                found.append(f"changes {what} during the call")
                effects.materialize_items(obj)
        if self.broken:
            found.append(f"reads what capture cannot watch ({self.broken})")
        return found


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING


def _module_file(name) -> str | None:
    return getattr(sys.modules.get(name), "__file__", None)


def _immutable(v) -> bool:
    """Values never kept as "from outside": scalars, JAX arrays, tracers, and the code and
    objects of JAX, NumPy and the standard library (their state is theirs)."""
    if v is None or v is MISSING or by_value(v) or isinstance(v, (jax.Array, Tracer, np.dtype)):
        return True
    if isinstance(v, (list, dict, set, tuple, np.ndarray, types.MethodType, functools.partial)):
        return False
    if isinstance(v, types.ModuleType):  # a module made at run time (no file) is the user's
        file = getattr(v, "__file__", None)
        return v.__name__ in sys.builtin_module_names if file is None else not watched_file(file)
    if isinstance(v, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return getattr(v, "__self__", None) is None or isinstance(v.__self__, types.ModuleType)
    if isinstance(v, types.FunctionType):
        name = v.__code__.co_filename
        if name.startswith("<"):  # generated: the module whose globals it runs in
            name = _module_file(v.__globals__.get("__name__")) or name
        return not watched_file(name)
    if isinstance(v, type):
        file = _module_file(v.__module__)
        return file is None or not watched_file(file)
    file = _module_file(type(v).__module__)  # an object of JAX's or NumPy's own classes
    return file is not None and any(s in file for s in _LIBRARIES)


def _of(head: str, what: str) -> str:
    """``head of what``, with a long chain of owners cut to its first and last two."""
    parts = what.split(" of ")
    if len(parts) > 3:
        what = " of ".join([parts[0], "...", *parts[-2:]])
    return f"{head} of {what}"


def _named(obj) -> str:
    if isinstance(obj, types.ModuleType):
        return f"module {obj.__name__}"
    if isinstance(obj, type):
        return f"class {obj.__qualname__}"
    return f"a {type(obj).__name__} object"
