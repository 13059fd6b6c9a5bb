"""Which frames a cold run watches, and the instructions it handles there (``reads.py``).

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
from mlsys_jax.execute.capture.state_guards import MISSING, by_value

_LIBRARIES = ("/jax/", "/jaxlib/", "/numpy/", "/scipy/", "/ml_dtypes/", "/opt_einsum/",
              "/optax/", "/mlsys_jax/execute/", "<frozen ")
_STDLIB = sysconfig.get_paths()["stdlib"]
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_HANDLED = {"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_ATTR", "LOAD_METHOD",
            "BINARY_SUBSCR", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF",
            "STORE_ATTR", "DELETE_ATTR", "MAKE_FUNCTION"}


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

    __slots__ = ("op", "name", "offset", "handler", "pred", "pred2")

    def __init__(self, ins, pred, pred2):
        self.op, self.name, self.offset = ins.opname, ins.argval, ins.offset
        self.handler = "_" + ins.opname.lower()
        self.pred, self.pred2 = pred, pred2  # (op, argval, offset) of the instructions before


TABLES: dict = {}


def table_of(code) -> dict:
    """offset -> Instr for the instructions of ``code`` the watch handles (cached per code)."""
    table = TABLES.get(code)
    if table is None:
        table, seq = {}, [i for i in dis.get_instructions(code)
                          if i.opname not in ("EXTENDED_ARG", "NOP", "CACHE")]
        for n, ins in enumerate(seq):
            getattr_call = _getattr_call(seq, n)
            if getattr_call is not None:
                table[ins.offset] = getattr_call
            elif ins.opname in _HANDLED:
                before = [None if ins.is_jump_target or n < k + 1 or (k and seq[n - k].is_jump_target)
                          else (seq[n - k - 1].opname, seq[n - k - 1].argval, seq[n - k - 1].offset)
                          for k in (0, 1)]
                table[ins.offset] = Instr(ins, *before)
        if len(TABLES) > 4096:
            TABLES.clear()
        TABLES[code] = table
    return table


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


