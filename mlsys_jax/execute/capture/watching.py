"""Which frames a cold run watches, the instructions it handles there (``reads.py``), and
where an attribute is found without running code (:func:`static_attr`).

Watched: the user's code, and the installed libraries that keep the user's state (flax, haiku,
equinox, keras, penzai...). Not watched: JAX, NumPy, SciPy, optax, the standard library and
capture itself — their code is not the user's, their objects hold no state of the user's, and
leaving them out keeps a cold run's cost near what it was (``sys.settrace`` still calls the
tracer on every frame; :func:`untraced` switches it off during capture's own work).
"""
from __future__ import annotations

import dis
import functools
import os
import sys
import sysconfig
import types

import jax
import numpy as np

from mlsys_jax.compat import Tracer
from mlsys_jax.execute.capture.state_guards import (MISSING, UNKNOWN, by_value, instance_dict,
                                                    read_slot)

_LIBRARIES = ("/jax/", "/jaxlib/", "/numpy/", "/scipy/", "/ml_dtypes/", "/opt_einsum/",
              "/optax/", "/mlsys_jax/execute/", "<frozen ")
_STDLIB = sysconfig.get_paths()["stdlib"]
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_HANDLED = {"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_ATTR", "LOAD_METHOD",
            "BINARY_SUBSCR", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF",
            "STORE_ATTR", "DELETE_ATTR", "MAKE_FUNCTION", "IMPORT_FROM"}


def watched_file(filename: str) -> bool:
    """Whether frames of this file are watched (not JAX, NumPy, the standard library, capture)."""
    if any(s in filename for s in _LIBRARIES):
        return False
    return not (filename.startswith(_STDLIB) and "site-packages" not in filename)


KINDS: dict = {}  # code -> what its frames are: None (not watched), "user" or "library"


def frame_kind(frame) -> str | None:
    """None for a frame that is not watched, else whose code it runs: ``"library"`` (an
    installed package: flax, haiku, keras...) or ``"user"``. Generated code (``<string>``:
    dataclasses' ``__init__``, namedtuples' ``__new__``, the user's ``exec``) belongs to the
    module whose globals it runs in."""
    code = frame.f_code
    kind = KINDS.get(code, False)
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
        if len(KINDS) > 65536:
            KINDS.clear()
        KINDS[code] = kind
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


class Instr:
    """A handled instruction: its opcode, argument, offset, the handler's name, and the
    instructions just before it (None where another path may lead in: a jump target)."""

    __slots__ = ("op", "name", "offset", "handler", "pred", "pred2", "args", "keyed", "followed")

    def __init__(self, ins, pred, pred2):
        self.op, self.name, self.offset = ins.opname, ins.argval, ins.offset
        self.handler = "_" + ins.opname.lower()
        self.pred, self.pred2 = pred, pred2  # (op, argval, offset) of the instructions before
        self.args: list = []  # a matched call's arguments, as pred
        self.keyed = False  # its value is only indexed: ``[k]`` or ``.get(k)`` follows
        self.followed = False  # (a LOAD_GLOBAL) the callee of a call the watch follows


TABLES: dict = {}


def table_of(code) -> dict:
    """offset -> Instr for the instructions of ``code`` the watch handles (cached per code)."""
    table = TABLES.get(code)
    if table is None:
        table, seq = {}, [i for i in dis.get_instructions(code)
                          if i.opname not in ("EXTENDED_ARG", "NOP", "CACHE")]
        callees = set()
        for n, ins in enumerate(seq):
            call = _getattr_call(seq, n) or _builtin_call(seq, n) or _get_call(seq, n)
            if call is not None:
                call.keyed = _keyed(seq, n + (ins.opname == "PRECALL"))
                table[ins.offset] = call
                callees.add(seq[n - ins.argval - 1].offset)
            elif ins.opname in _HANDLED:
                before = [None if ins.is_jump_target or n < k + 1 or (k and seq[n - k].is_jump_target)
                          else (seq[n - k - 1].opname, seq[n - k - 1].argval, seq[n - k - 1].offset)
                          for k in (0, 1)]
                table[ins.offset] = Instr(ins, *before)
                table[ins.offset].keyed = _keyed(seq, n)
                if ins.opname == "IMPORT_FROM":
                    table[ins.offset].args = _imported(seq, n)
        for offset in callees.intersection(table):  # (found after their LOAD_GLOBAL)
            table[offset].followed = True
        if len(TABLES) > 4096:
            TABLES.clear()
        TABLES[code] = table
    return table


def _call_at(seq, n, argc_ok) -> int | None:
    """The argument count of the call at ``seq[n]`` (``PRECALL``, or a ``CALL`` without one)
    when ``argc_ok(argc)`` and no jump lands after its callee's load, else None."""
    ins = seq[n]
    if ins.opname != "PRECALL" and not (ins.opname == "CALL" and seq[n - 1].opname != "PRECALL"):
        return None
    argc = ins.argval
    if not argc_ok(argc) or n < argc + 2 or any(i.is_jump_target for i in seq[n - argc:n + 1]):
        return None
    return argc


def _matched(seq, n, pred, handler, args=()) -> Instr:
    """The Instr of a matched call: found at its ``CALL``'s offset by a chained read."""
    call = Instr(seq[n], pred, None)
    call.handler, call.args = handler, [_ref(i) for i in args]
    if seq[n].opname == "PRECALL" and n + 1 < len(seq):
        call.offset = seq[n + 1].offset
    return call


def _ref(ins) -> tuple:
    return ins.opname, ins.argval, ins.offset


_SIMPLE = ("LOAD_CONST", "LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL")  # one instruction, no call
_UNHANDLED_LOADS = ("LOAD_CONST", "LOAD_FAST")  # loads that leave the chained reads as they are


def _builtin_call(seq, n) -> Instr | None:
    """``globals()``, ``super()`` or ``super(cls, obj)``, ``__import__(name)`` or
    ``importlib.import_module(name)`` (arguments simple loads): the watch computes what they
    return, so that the read that follows is seen (``reads.py``)."""
    argc = _call_at(seq, n, lambda a: a in (0, 1, 2))
    if argc is None or not all(i.opname in _SIMPLE for i in seq[n - argc:n]):
        return None
    callee, args = seq[n - argc - 1], seq[n - argc:n]
    if callee.opname == "LOAD_METHOD" and callee.argval == "import_module" and argc == 1:
        return _matched(seq, n, _ref(seq[n - argc - 2]), "_import_call", args)
    if callee.opname != "LOAD_GLOBAL":
        return None
    if callee.argval == "globals" and argc == 0:
        return _matched(seq, n, None, "_globals_call")
    if callee.argval == "super" and argc != 1:
        return _matched(seq, n, None, "_super_call", args)
    if callee.argval in ("__import__", "import_module") and argc == 1:
        return _matched(seq, n, _ref(callee), "_import_call", args)
    return None


def _get_call(seq, n) -> Instr | None:
    """``d.get(k)`` or ``d.get(k, default)`` with constant or local arguments: its ``pred`` the
    instruction that loads ``d``."""
    argc = _call_at(seq, n, lambda a: a in (1, 2))
    if argc is None or seq[n - argc - 1].opname != "LOAD_METHOD" \
            or seq[n - argc - 1].argval != "get" or seq[n - argc - 1].is_jump_target \
            or not all(i.opname in _UNHANDLED_LOADS for i in seq[n - argc:n]):
        return None
    return _matched(seq, n, _ref(seq[n - argc - 2]), "_get_call", seq[n - argc:n])


def _imported(seq, n) -> list:
    """``[module name, level]`` of the ``IMPORT_NAME`` an ``IMPORT_FROM`` reads from (its
    ``from`` clause), or ``[]``."""
    k = n - 1
    while k >= 0 and seq[k].opname in ("IMPORT_FROM", "STORE_FAST", "STORE_NAME", "STORE_GLOBAL",
                                       "STORE_DEREF"):
        k -= 1
    if k < 2 or seq[k].opname != "IMPORT_NAME" or seq[k - 2].opname != "LOAD_CONST":
        return []
    return [seq[k].argval, seq[k - 2].argval]


def _keyed(seq, p) -> bool:
    """Whether the value ``seq[p]`` pushes is only indexed, by a key the watch can read:
    ``[k]`` (``k`` a constant, a local or a global) or ``.get(k[, d])`` (constants or locals)."""
    after = seq[p + 1:p + 5]
    if any(i.is_jump_target for i in after):
        return False
    if len(after) >= 2 and after[0].opname in ("LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL") \
            and after[1].opname == "BINARY_SUBSCR":
        return True
    if not after or after[0].opname != "LOAD_METHOD" or after[0].argval != "get":
        return False
    argc = next((k for k, i in enumerate(after[1:]) if i.opname not in _UNHANDLED_LOADS), 0)
    call = after[1 + argc] if 1 + argc < len(after) else None
    return argc in (1, 2) and call is not None and call.opname in ("PRECALL", "CALL") \
        and call.argval == argc


def _getattr_call(seq, n) -> Instr | None:
    """A call of a builtin that reads an attribute as ``obj.name`` does: ``getattr(obj,
    "name")``, ``getattr(obj, "name", default)`` or ``hasattr(obj, "name")`` with a constant
    name, ``vars(obj)`` (``obj.__dict__``) or ``type(obj)`` (``obj.__class__``). An Instr for the
    call — its ``name`` the attribute's, ``pred`` the instruction that loads ``obj``, ``pred2``
    the builtin's name, ``offset`` the call's (where a chained read finds the result) — or None."""
    ins = seq[n]
    if ins.opname != "PRECALL" and not (ins.opname == "CALL" and seq[n - 1].opname != "PRECALL"):
        return None
    argc = ins.argval
    if argc not in (1, 2, 3) or n < argc + 1 or seq[n - argc - 1].opname != "LOAD_GLOBAL" \
            or any(i.is_jump_target for i in seq[n - argc:n + 1]):
        return None
    callee, obj = seq[n - argc - 1].argval, seq[n - argc]
    if argc == 1 and callee in _VIEWS:
        name = _VIEWS[callee]
    elif callee == "getattr" and argc in (2, 3) or callee == "hasattr" and argc == 2:
        const = seq[n - argc + 1]
        if const.opname != "LOAD_CONST" or not isinstance(const.argval, str):
            return None
        name = const.argval
    else:
        return None
    call = Instr(ins, (obj.opname, obj.argval, obj.offset), callee)
    call.name, call.handler = name, "_getattr_call"
    if ins.opname == "PRECALL" and n + 1 < len(seq):
        call.offset = seq[n + 1].offset
    return call


_VIEWS = {"vars": "__dict__", "type": "__class__"}


def module_file(name) -> str | None:
    """The file a loaded module came from, or None (built-in, not loaded)."""
    return getattr(sys.modules.get(name), "__file__", None)


def immutable(v) -> bool:
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
            name = module_file(v.__globals__.get("__name__")) or name
        return not watched_file(name)
    if isinstance(v, type):
        file = module_file(v.__module__)
        return file is None or not watched_file(file)
    file = module_file(type(v).__module__)  # an object of JAX's or NumPy's own classes
    return file is not None and any(s in file for s in _LIBRARIES)


_HEAPTYPE = 1 << 9  # a class made by a class statement (not a C type: object, dict...)
_SHADOWABLE: dict = {}


def shadowable(cls) -> bool:
    """Whether an attribute set on ``cls`` later is the user's change to see: a class of the
    user's or an installed library's, not a C type nor JAX's, NumPy's or the standard
    library's (cached per class)."""
    known = _SHADOWABLE.get(cls)
    if known is None:
        file = module_file(cls.__module__)
        known = bool(cls.__flags__ & _HEAPTYPE) and (file is None or watched_file(file))
        if len(_SHADOWABLE) > 4096:
            _SHADOWABLE.clear()
        _SHADOWABLE[cls] = known
    return known


def static_attr(obj, name):
    """(value or UNKNOWN, [(kind, holder, key, held)]): ``obj.name`` found without running
    code, and the places that decide it (an instance's own entry or slot, or its absence and the
    class's entry). A property's value is UNKNOWN: its getter runs, and is watched."""
    mro = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
    owner = next((k for k in mro if name in k.__dict__), None)
    found = owner.__dict__[name] if owner is not None else MISSING
    # the classes before the owner must still lack it (a subclass given it later shadows it)
    shadows = [("entry", k.__dict__, name, MISSING) for k in mro[:mro.index(owner)]
               if shadowable(k)] if owner is not None else []
    if isinstance(obj, type):
        return (UNKNOWN, []) if owner is None else (
            found, shadows + [("entry", owner.__dict__, name, found)])
    places = [] if owner is None else shadows + [("entry", owner.__dict__, name, found)]
    if isinstance(found, types.MemberDescriptorType):  # a slot: read by its C descriptor
        held = read_slot(obj, found)
        return (UNKNOWN if held is MISSING else held), [("slot", obj, found, held)]
    if found is not MISSING and hasattr(type(found), "__set__"):  # a property, a C getter
        return UNKNOWN, places
    inst = instance_dict(obj)
    if inst is not None and name in inst:
        return inst[name], [("entry", inst, name, inst[name])]
    if found is MISSING:
        if hasattr(type(obj), "__getattr__"):
            return UNKNOWN, []  # __getattr__: its Python is watched
        # absent (getattr's default, hasattr, an AttributeError caught): absent from the class
        # and from the instance
        return UNKNOWN, [("entry", type(obj).__dict__, name, MISSING)] + (
            [("entry", inst, name, MISSING)] if inst is not None else [])
    return found, places + ([("entry", inst, name, MISSING)] if inst is not None else [])
