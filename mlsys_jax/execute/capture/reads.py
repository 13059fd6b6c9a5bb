"""What the captured Python reads and changes outside its arguments, watched while it records.

Dynamo knows every read because it interprets a frame's bytecode itself; capture runs the real
Python, so during a cold run it watches it. ``sys.settrace`` delivers an event before each
instruction of a *watched* frame — the user's code and the libraries that keep state (flax,
haiku, equinox, keras...); JAX, NumPy, the standard library and capture itself are not watched,
and capture's own handlers switch tracing off (``untraced``), so a cold run costs about what it
did. At each instruction that reads outside the call:

- ``LOAD_GLOBAL``, ``LOAD_DEREF`` (a closure cell of a function made before the call): a guard on
  that global or cell (``state_guards.py``);
- ``LOAD_ATTR`` / ``LOAD_METHOD`` / ``BINARY_SUBSCR``, and the builtins that read an attribute
  (``getattr``/``hasattr`` with a constant name, ``vars``, ``type``), on an object from
  outside — found from the instruction before (``self.w``, ``self.layer.w``, ``CFG['k']``), or
  else every object from outside that has that attribute: a guard on the attribute where the
  object keeps it (its ``__dict__``, or its class's) — read statically, never running a property or ``__getattr__``,
  whose own Python is watched instead;
- what C code returns that the watch can compute itself — ``super()`` and ``super(C, self)``
  (``super().x``: the class that holds ``x`` and the classes before it), ``globals()``,
  ``sys.modules[name]`` / ``.get(name)``, ``importlib.import_module(name)``, ``d.get(k)`` —, so
  that the read after it is guarded; ``super`` or ``globals`` called otherwise, and state capture
  cannot guard (a ctypes object: ``process_state.py``), make the calls run eagerly (``unguarded``);
- process state read in a watched frame — ``os.environ``, a ``ContextVar``, a
  ``threading.local``, an ``lru_cache`` of the user's — is guarded by what stands for it
  (``process_state.py``).

The objects reached from outside are kept with snapshots (``outside.py``); after the call a
snapshot that differs, a global or closure variable written, or a call to ``print``, a file, a
logger, the clock or a global random generator (``effects.py``) is a *side effect*: warm calls
replay compiled programs without the Python, so such a path is not replayed
(:meth:`ReadWatch.finish` also puts concrete arrays where a deferred value was stored, as eager
would have). A library's own state — its module globals and its closures — is the library's:
read there, it is not guarded, and a library frame is watched only when it is given an object
from outside (an nnx module, a Keras layer, the user's params dict).
"""
from __future__ import annotations

import builtins
import gc
import importlib
import importlib.util
import sys
import types

from mlsys_jax.compat import Tracer, x64_enabled
from mlsys_jax.execute.capture import effects, process_state
from mlsys_jax.execute.capture.break_guards import value_key
from mlsys_jax.execute.capture.outside import OutsideObjects, named, outside_of
from mlsys_jax.execute.capture.state_guards import (MISSING, UNKNOWN, StateGuard, by_value,
                                                    contents_of, instance_dict)
from mlsys_jax.execute.capture.watching import (KINDS, TABLES, frame_kind, shadowable,
                                                static_attr, table_of)

_LOCAL_LOADS = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLOSURE")
_CHAINED = ("LOAD_ATTR", "LOAD_METHOD", "BINARY_SUBSCR", "CALL")  # CALL: of a watched builtin
_BUILTINS = {"getattr": getattr, "hasattr": hasattr, "vars": vars, "type": type}

class ReadWatch:
    """Watches one cold run: ``with watch: fn(...)``, then :meth:`finish` for the side effects;
    ``guards`` holds the reads (``StateGuard``), in the order they were first made."""

    def __init__(self, fn, static_leaves=(), tree=None):
        self.guards: dict = {"x64": StateGuard("JAX's float64 setting (jax_enable_x64)", "the call",
                                               "x64", None, None, x64_enabled())}
        self.objects = OutsideObjects(self.guards)
        self.outside = self.objects.known  # id -> (object, what it was read as)
        self.writes: dict = {}  # (id(holder), key) -> (holder, key, held before, what, where)
        self.made: set = set()  # code objects of functions made during the call
        self.searched: set = set()
        self.last: dict = {}  # id(frame) -> {None: code, offset: value read there this pass}
        self.effects: list[str] = []
        self.broken: str | None = None
        self._prev = None
        self.objects.register(fn, "the captured function")
        for f in (fn, getattr(fn, "__func__", None)):
            for attr in ("__defaults__", "__kwdefaults__") if isinstance(
                    f, types.FunctionType) else ():  # replaced: f.__defaults__ = (3.0,)
                slot = types.FunctionType.__dict__[attr]
                if slot.__get__(f) is not None:  # (without defaults every call passes them all)
                    self.guards[("slot", id(f), slot)] = StateGuard(
                        f"{attr} of {f.__qualname__}", "the call", "slot", f, slot, slot.__get__(f))
            for i, v in enumerate(getattr(f, "__defaults__", None) or ()):
                self.objects.register(v, f"default argument {i + 1} of {getattr(f, '__qualname__', f)}")
            for k, v in (getattr(f, "__kwdefaults__", None) or {}).items():
                self.objects.register(v, f"default argument {k!r} of {getattr(f, '__qualname__', f)}")
        for i, v in enumerate(static_leaves):
            self.objects.register(v, f"static argument {i + 1}")
        for aux in _static_fields(tree):  # a pytree's own static data (an equinox field)
            self.objects.register(aux, "a static field of the arguments")

    # ---- tracing ------------------------------------------------------------------------------
    def __enter__(self):
        # The tracer runs on every Python call of the cold run, JAX's included: closures over
        # locals, no attribute lookups, on the way that returns at once.
        self._prev = prev = sys.gettrace()
        kinds, tables, outside, last = KINDS, TABLES, self.outside, self.last

        def event(frame, what, arg):
            if what == "opcode":
                table = tables.get(frame.f_code)
                ins = (table if table is not None else table_of(frame.f_code)).get(frame.f_lasti)
                if ins is not None:
                    seen = last.get(id(frame))
                    if seen is not None:  # (what this instruction read on an earlier pass)
                        seen.pop(ins.offset, None)
                    try:
                        getattr(self, ins.handler)(frame, ins)
                    except Exception as e:  # noqa: BLE001 - never break the user's code
                        self.broken = self.broken or f"{type(e).__name__}: {e}"
            elif what == "return":
                last.pop(id(frame), None)
            return event

        def call(frame, what, arg):
            theirs = prev(frame, what, arg) if prev is not None else None
            kind = kinds.get(frame.f_code, False)
            if kind is False:
                kind = frame_kind(frame)
            if kind is None or kind == "library" and not any(
                    id(v) in outside for v in frame.f_locals.values()):
                return theirs  # (a library frame given nothing from outside: its own state)
            frame.f_trace_opcodes = True
            return event if theirs is None else _both(theirs, event)

        sys.settrace(call)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._prev)
        for entries, what in self.objects.caches:  # what the run's own calls left in them
            self.guards[("contents", id(entries), None)] = StateGuard(
                f"the entries of {what}", "the call", "contents", entries, None,
                contents_of(entries), latest=True)

    @property
    def unguarded(self) -> str | None:
        """The first read capture cannot guard (a ctypes object...), or None."""
        return self.objects.unguarded

    # ---- reads --------------------------------------------------------------------------------
    def _load_global(self, frame, ins):
        g = frame.f_globals
        v = g.get(ins.name, MISSING)
        if v is MISSING:  # a builtin: not guarded, but print() & co. are side effects
            v = frame.f_builtins.get(ins.name)
            self._effect(frame, v)
            if not ins.followed and _unfollowed(v) and KINDS.get(frame.f_code) != "library":
                # super(type(self), self), g = globals (a library's reads are its own)
                self._unguarded(frame, f"{ins.name}() called in a way capture cannot follow")
            return
        if KINDS.get(frame.f_code) == "library":  # a library's own state is the library's
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

    def _load_name(self, frame, ins):
        # eval()'d and exec()'d code, a class body: its locals first, then as a global
        local = frame.f_locals
        if local is not frame.f_globals and ins.name in local:
            self._loaded(frame, ins, local[ins.name])
        else:
            self._load_global(frame, ins)

    def _load_attr(self, frame, ins):
        obj = self._operand(frame, ins.pred)
        if type(obj) is super:
            self._super_attr(frame, ins, obj)
            return
        if isinstance(obj, types.ModuleType) and id(obj) not in self.outside \
                and KINDS.get(frame.f_code) != "library":  # imported in the call: `import cfg`
            self.objects.register(obj, named(obj))
        if ins.name in ("__dict__", "__class__") and id(obj) in self.outside:
            # read by C getters: the instance dict and the class are objects from outside too
            v = type(obj) if ins.name == "__class__" else vars(obj) if isinstance(
                obj, type) else instance_dict(obj)  # (a class's: a mappingproxy of its dict)
            what = outside_of(f"attribute {ins.name!r}", self.outside[id(obj)][1])
            if v is not None:
                self.objects.register(v, what)
                self._loaded(frame, ins, v)
            return
        if obj is UNKNOWN:  # every outside object that holds the attribute is guarded on it
            for holder in self.objects.by_attr.get(ins.name, ()):
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

    def _getattr_call(self, frame, ins):
        # getattr(obj, "w") and hasattr(obj, "w") read obj.w, vars(obj) obj.__dict__, type(obj)
        # obj.__class__ — unless the builtin's name is rebound
        if frame.f_globals.get(ins.pred2, frame.f_builtins.get(ins.pred2)) is _BUILTINS[ins.pred2]:
            self._load_attr(frame, ins)

    def _binary_subscr(self, frame, ins):
        key = self._operand(frame, ins.pred)
        obj = self._operand(frame, ins.pred2) if key is not UNKNOWN else UNKNOWN
        if obj is not UNKNOWN:
            self._item(frame, ins, obj, key, MISSING)

    def _get_call(self, frame, ins):
        # d.get(k) / d.get(k, default), read as d[k] is
        obj, key = self._operand(frame, ins.pred), self._operand(frame, ins.args[0])
        default = self._operand(frame, ins.args[1]) if len(ins.args) > 1 else None
        if obj is not UNKNOWN and key is not UNKNOWN:
            self._item(frame, ins, obj, key, default)

    def _item(self, frame, ins, obj, key, default):
        """``obj[key]``: a module's globals (``globals()["S"]``) and ``sys.modules`` guarded by
        the entry; an outside container is guarded by its contents, the item only carries a
        chain on (a subclass's ``__getitem__`` may be Python: it is watched itself)."""
        try:
            hash(key)
        except TypeError:
            return
        module = obj is sys.modules or _module_dict(frame, obj)
        if module:
            v = obj.get(key, MISSING)
            if KINDS.get(frame.f_code) != "library":
                name = obj.get("__name__") if obj is not sys.modules else None
                what = f"sys.modules[{key!r}]" if obj is sys.modules else (
                    f"global {key!r}" + (f" of {name}" if isinstance(name, str) else "")
                    + " (through globals())")
                self._guard(frame, "entry", obj, key, v, what)
        elif type(obj) in (dict, list, tuple) and id(obj) in self.outside:
            try:
                v = obj.get(key, MISSING) if type(obj) is dict else \
                    obj[key] if type(key) is int else UNKNOWN
            except (IndexError, TypeError):
                return
        else:
            return
        v = default if v is MISSING else v
        if v is not UNKNOWN and v is not MISSING:
            self._loaded(frame, ins, v)

    def _import_call(self, frame, ins):
        # __import__(name) or importlib.import_module(name) of a loaded module: sys.modules[name]
        fn, name = self._operand(frame, ins.pred), self._operand(frame, ins.args[0])
        if (fn is builtins.__import__ or fn is importlib.import_module or fn is importlib) \
                and isinstance(name, str) and "." not in name and name in sys.modules:
            self._item(frame, ins, sys.modules, name, MISSING)

    def _import_from(self, frame, ins):
        # `from cfg import SCALE` in the call: the attribute of the module, as cfg.SCALE
        if not ins.args or KINDS.get(frame.f_code) == "library":
            return
        name, level = ins.args
        try:
            if level:
                name = importlib.util.resolve_name("." * level + name,
                                                   frame.f_globals.get("__package__"))
        except (ImportError, ValueError, TypeError):
            return
        module = sys.modules.get(name)
        if isinstance(module, types.ModuleType):
            self.objects.register(module, named(module))
            if id(module) in self.outside:
                v, places = static_attr(module, ins.name)
                self._guard_places(frame, module, ins.name, places)

    def _globals_call(self, frame, ins):
        # globals(): the frame's module dict; read only as globals()[k] or .get(k), the entry
        # is guarded there (_item), else the whole dict by its contents
        if _builtin(frame, "globals") is not builtins.globals:
            return
        g = frame.f_globals
        if not ins.keyed and KINDS.get(frame.f_code) != "library":
            name = g.get("__name__")
            self.objects.register(g, "globals()" + (f" of {name}" if isinstance(name, str) else ""))
        self._loaded(frame, ins, g)

    def _super_call(self, frame, ins):
        # super() or super(cls, obj): made here as the call will make it, for the read after it
        if _builtin(frame, "super") is not builtins.super:
            return
        if ins.args:
            cls, obj = (self._operand(frame, a) for a in ins.args)
        else:
            code, local = frame.f_code, frame.f_locals
            cls = local.get("__class__", UNKNOWN)
            obj = local.get(code.co_varnames[0], UNKNOWN) if code.co_argcount else UNKNOWN
        try:
            self._loaded(frame, ins, super(cls, obj))
        except TypeError:  # (UNKNOWN, or what the call itself will refuse)
            pass

    def _super_attr(self, frame, ins, sup):
        """``super().name``: the classes after ``__thisclass__`` in the instance's MRO up to the
        one that holds ``name`` — their lack of it, and its entry there."""
        mro = sup.__self_class__.__mro__
        try:
            start = mro.index(sup.__thisclass__) + 1
        except ValueError:
            return
        owner = next((k for k in mro[start:] if ins.name in k.__dict__), None)
        what = f"attribute {ins.name!r} of super() in {sup.__thisclass__.__qualname__}"
        for k in mro[start:mro.index(owner) + 1 if owner is not None else len(mro)]:
            if shadowable(k):
                self._guard(frame, "entry", k.__dict__, ins.name, k.__dict__.get(ins.name, MISSING),
                            what)
        found = owner.__dict__[ins.name] if owner is not None else MISSING
        if found is not MISSING and not hasattr(type(found), "__get__"):
            self._loaded(frame, ins, found)  # a plain value (a method binds: its frame is watched)

    def _unguarded(self, frame, what):
        self.objects.unguarded = self.objects.unguarded or (
            f"{what} (at {frame.f_code.co_filename}:{frame.f_lineno})")

    def _loaded(self, frame, ins, v):
        seen = self.last.get(id(frame))
        if seen is None or seen[None] is not frame.f_code:
            seen = self.last[id(frame)] = {None: frame.f_code}
        seen[ins.offset] = v
        self._effect(frame, v)
        if process_state.watched_read(v) and KINDS.get(frame.f_code) != "library":
            # os.environ, a ContextVar, an lru_cache, ctypes... (a library's are its own)
            if v is not sys.modules:
                self.objects.register(v, process_state.describe(v))
            elif not ins.keyed:
                self._unguarded(frame, "sys.modules other than as sys.modules[name]")
        elif _unfollowed(v) and KINDS.get(frame.f_code) != "library":  # G = globals
            self._unguarded(frame, f"{v.__name__} reached as a value, whose calls capture "
                                   "cannot follow")

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
            seen = self.last.get(id(frame))
            return seen.get(offset, UNKNOWN) if seen is not None and seen[None] is frame.f_code \
                else UNKNOWN
        return UNKNOWN

    def _cell(self, frame, name):
        """The closure cell a frame reads ``name`` from, when its function was made before the
        call (None: a cell of this call, or not a free variable)."""
        code = frame.f_code
        if name not in code.co_freevars:
            return None
        for attempt in range(2):
            for fn in self.objects.by_code.get(code, ()):
                cells = dict(zip(code.co_freevars, fn.__closure__ or ()))
                if all(_contents(c) is frame.f_locals.get(n, MISSING) for n, c in cells.items()):
                    return cells[name]
            if code in self.made or attempt or code in self.searched \
                    or KINDS.get(code) == "library":  # a library's closures are the library's
                break
            self.searched.add(code)  # a function reached another way: find it once
            for ref in gc.get_referrers(code):
                if isinstance(ref, types.FunctionType) and ref.__code__ is code:
                    self.objects.register(ref, f"function {ref.__qualname__}")
        if code not in self.made and KINDS.get(code) != "library":
            self.broken = self.broken or (f"a closure variable {name!r} of {code.co_qualname} "
                                          "whose function capture cannot find")
        return None

    def _guard_places(self, frame, obj, name, places):
        what = outside_of(f"attribute {name!r}", self.outside.get(id(obj), (None, named(obj)))[1])
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
        self.objects.register(v, what)

    # ---- writes and side effects --------------------------------------------------------------
    def _store_global(self, frame, ins):
        if KINDS.get(frame.f_code) != "library":
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
            self._write(frame, obj.__dict__, ins.name, f"attribute {ins.name!r} of {named(obj)}")

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
        found += self.objects.changes()
        if self.objects.overflow:
            found.append(f"reads what capture cannot keep ({self.objects.overflow})")
        if self.broken:
            found.append(f"reads what capture cannot watch ({self.broken})")
        return found


def _unfollowed(v) -> bool:
    """``super`` and ``globals``: their calls are followed only where made as such."""
    return v is builtins.super or v is builtins.globals


def _builtin(frame, name):
    """What ``name`` means in a frame when it is not a local: its global, else the builtin."""
    return frame.f_globals.get(name, frame.f_builtins.get(name))


def _module_dict(frame, obj) -> bool:
    """Whether ``obj`` is a module's globals: the frame's own, or a loaded module's dict."""
    if obj is frame.f_globals:
        return True
    name = obj.get("__name__") if type(obj) is dict else None
    return isinstance(name, str) and instance_dict(sys.modules.get(name)) is obj


def _both(theirs, ours):
    """A frame's local tracer that is a debugger's or coverage's and ours."""
    def both(frame, what, arg):
        nonlocal theirs
        theirs = theirs(frame, what, arg) if theirs is not None else None
        ours(frame, what, arg)
        return both
    return both


def _static_fields(tree, budget: int = 256) -> list:
    """The auxiliary data of a pytree structure's nodes (a module's static fields)."""
    out, stack = [], [tree] if tree is not None else []
    while stack and len(out) < budget:
        t = stack.pop()
        if t.num_nodes == 1 and t.num_leaves <= 1:
            continue  # a leaf, or an empty container
        data = t.node_data()  # (node type, aux): for dicts the keys, which the key covers
        if data is not None and data[1] is not None and data[0] not in (dict, list, tuple):
            out.append(data[1])
        stack.extend(t.children())
    return out


def _contents(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return MISSING
