"""Capture and reads a replay could answer stale (issue #39, round three): ``super()``,
``globals()``, a bound ``dict.get``, a cleared ``lru_cache``, ``sys.modules``, and process state
(``os.environ``, ``ContextVar``, ``threading.local``, ``array.array``, ``bytearray``,
``MappingProxyType``, ctypes).

Each case is captured and called (cold, warm, one program), the outside value is changed, and
every later call must equal a fresh eager call — never the recorded value. A read capture guards
is named by the guard that failed; a read it cannot guard makes the calls run eagerly, and the
one-line reason in ``explain().fallback`` names it.
"""
import array
import contextvars
import ctypes
import os
import sys
import textwrap
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.execute import capture, explain
from mlsys_jax.fuzz.capture_oracle import compare

X = jnp.array([1.0, -2.0, 3.0], jnp.float32)
ENV = "MLSYS_JAX_CAPTURE_HOSTILE_SCALE"
MODULE = "mlsys_jax_capture_hostile_cfg"


def module(source: str, **names) -> dict:
    """A namespace of its own (its dict is the program's globals), with ``names`` in it."""
    ns = {"jax": jax, "jnp": jnp, "np": np, "os": os, "sys": sys, **names}
    exec(textwrap.dedent(source), ns)  # noqa: S102 - the test's own program
    return ns


# --- each case: (the function, the change, what the guard failure or the reason names) -------

def super_zero_arg(_):
    m = module("""
        class Base:
            S = 2.0
        class Layer(Base):
            S = 5.0
            def f(self, x):
                return x * super().S
    """)
    return m["Layer"]().f, lambda: setattr(m["Base"], "S", 3.0), "super() in Layer"


def super_two_args(_):
    m = module("""
        class Base:
            S = 2.0
        class Mid(Base):
            pass
        class Layer(Mid):
            def f(self, x):
                return x * super(Layer, self).S
    """)
    return m["Layer"]().f, lambda: setattr(m["Mid"], "S", 3.0), "super() in Layer"


def super_method(_):
    m = module("""
        class Base:
            def scale(self, x):
                return x * 2.0
        class Layer(Base):
            def scale(self, x):
                return super().scale(x) + 1.0
    """)
    return m["Layer"]().scale, lambda: setattr(m["Base"], "scale", lambda self, x: x * 3.0), \
        "super() in Layer"


def globals_item(_):
    m = module("""
        S = 2.0
        def f(x):
            return x * globals()["S"]
    """)
    return m["f"], lambda: m.update(S=3.0), "global 'S'"


def globals_get(_):
    m = module("""
        S = 2.0
        def f(x):
            return x * globals().get("S", 1.0)
    """)
    return m["f"], lambda: m.pop("S"), "global 'S'"


def bound_dict_get(_):
    m = module("""
        CONFIG = {"scale": 2.0}
        get = CONFIG.get  # bound before the call: the method, not CONFIG, is read
        def f(x):
            return x * get("scale")
    """)
    return m["f"], lambda: m["CONFIG"].update(scale=3.0), "global 'get'"


def lru_cache_cleared(_):
    m = module("""
        import functools
        S = 2.0
        @functools.lru_cache(maxsize=None)
        def scale():
            return S
        scale()  # filled at import: the call hits, its body does not run
        def f(x):
            return x * scale()
    """)

    def clear():
        m["S"] = 3.0
        m["scale"].cache_clear()
        m["f"](X), m["f"](X)  # filled again by eager calls (hits and misses as before)
    return m["f"], clear, "lru_cache of scale"


def sys_modules_item(monkeypatch):
    cfg = types.ModuleType(MODULE)
    cfg.SCALE = 2.0
    monkeypatch.setitem(sys.modules, MODULE, cfg)
    m = module("""
        def f(x):
            return x * sys.modules[NAME].SCALE
    """, NAME=MODULE)
    return m["f"], lambda: setattr(cfg, "SCALE", 3.0), "attribute 'SCALE'"


def sys_modules_replaced(monkeypatch):
    cfg, other = types.ModuleType(MODULE), types.ModuleType(MODULE)
    cfg.SCALE, other.SCALE = 2.0, 3.0
    monkeypatch.setitem(sys.modules, MODULE, cfg)
    m = module(f"""
        import importlib
        def f(x):
            return x * sys.modules.get("{MODULE}").SCALE + importlib.import_module("{MODULE}").SCALE
    """)
    return m["f"], lambda: sys.modules.__setitem__(MODULE, other), f"sys.modules['{MODULE}']"


def imported_in_the_call(monkeypatch):
    cfg = types.ModuleType(MODULE)
    cfg.SCALE, cfg.SHIFT = 2.0, 1.0
    monkeypatch.setitem(sys.modules, MODULE, cfg)
    m = module(f"""
        def f(x):
            import {MODULE}
            from {MODULE} import SHIFT
            return x * {MODULE}.SCALE + SHIFT
    """)

    def change():
        cfg.SCALE, cfg.SHIFT = 3.0, -1.0
    return m["f"], change, "attribute 'SHIFT'"


def os_environ(monkeypatch):
    monkeypatch.setenv(ENV, "2.0")
    m = module(f"""
        def f(x):
            return x * float(os.environ["{ENV}"])
    """)
    return m["f"], lambda: monkeypatch.setenv(ENV, "3.0"), "os.environ"


def os_getenv(monkeypatch):
    monkeypatch.setenv(ENV, "2.0")
    m = module(f"""
        from os import getenv
        def f(x):
            return x * float(getenv("{ENV}", "1.0"))
    """)
    return m["f"], lambda: monkeypatch.delenv(ENV), "os.environ"


def context_var(_):
    var = contextvars.ContextVar("scale", default=2.0)
    m = module("def f(x):\n    return x * VAR.get()\n", VAR=var)
    return m["f"], lambda: var.set(3.0), "ContextVar 'scale'"


def thread_local(_):
    local = threading.local()
    local.scale = 2.0
    m = module("def f(x):\n    return x * LOCAL.scale\n", LOCAL=local)
    return m["f"], lambda: setattr(local, "scale", 3.0), "global 'LOCAL'"


def array_item(_):
    a = array.array("d", [2.0])
    m = module("def f(x):\n    return x * A[0]\n", A=a)
    return m["f"], lambda: a.__setitem__(0, 3.0), "global 'A'"


def bytearray_item(_):
    b = bytearray([2])
    m = module("def f(x):\n    return x * B[0]\n", B=b)
    return m["f"], lambda: b.__setitem__(0, 3), "global 'B'"


def mapping_proxy(_):
    d = {"scale": 2.0}
    m = module("def f(x):\n    return x * P['scale']\n", P=types.MappingProxyType(d))
    return m["f"], lambda: d.update(scale=3.0), "mappingproxy"


GUARDED = [super_zero_arg, super_two_args, super_method, globals_item, globals_get,
           bound_dict_get, lru_cache_cleared, sys_modules_item, sys_modules_replaced,
           imported_in_the_call, os_environ,
           os_getenv, context_var, thread_local, array_item, bytearray_item, mapping_proxy]


# --- reads capture cannot guard: eager, with the reason ------------------------------------

def ctypes_value(_):
    d = ctypes.c_double(2.0)
    m = module("def f(x):\n    return x * D.value\n", D=d)
    return m["f"], lambda: setattr(d, "value", 3.0), "a ctypes object (c_double) (global 'D'"


def memoryview_item(_):
    raw = bytearray(np.float64(2.0).tobytes())
    m = module("def f(x):\n    return x * M.cast('d')[0]\n", M=memoryview(raw))
    return m["f"], lambda: raw.__setitem__(slice(None), np.float64(3.0).tobytes()), \
        "a memoryview (global 'M'"


def super_of_a_computed_class(_):
    m = module("""
        class Base:
            S = 2.0
        class Layer(Base):
            def f(self, x):
                return x * super(type(self), self).S
    """)
    return m["Layer"]().f, lambda: setattr(m["Base"], "S", 3.0), "super() called in a way"


def sys_modules_iterated(monkeypatch):
    cfg = types.ModuleType(MODULE)
    cfg.SCALE = 2.0
    monkeypatch.setitem(sys.modules, MODULE, cfg)
    m = module("""
        def f(x):
            mods = sys.modules
            return x * mods[NAME].SCALE
    """, NAME=MODULE)
    return m["f"], lambda: setattr(cfg, "SCALE", 3.0), "sys.modules other than"


UNGUARDED = [ctypes_value, memoryview_item, super_of_a_computed_class, sys_modules_iterated]


def run_case(fn, change):
    """Capture ``fn``, call it (cold, warm, one program), change the outside value, call
    again: every call equals a fresh eager call, and the change mattered."""
    c = capture(fn)
    before = fn(X)
    for _ in range(3):
        assert compare(c(X), before) is None
    change()
    after = fn(X)
    assert compare(after, before) is not None, "the change must change eager's result"
    for _ in range(3):
        diff = compare(c(X), fn(X))
        assert diff is None, f"stale: {diff}"
    return c


@pytest.mark.parametrize("case", GUARDED, ids=lambda f: f.__name__)
def test_a_guarded_read_records_again_when_it_changes(case, monkeypatch):
    fn, change, named = case(monkeypatch)
    c = run_case(fn, change)
    e = explain(c, X)
    assert e.fallback is None, e.fallback
    assert c.stats["cold"] >= 2 and c.stats["warm"] >= 3, c.stats  # replayed before and after
    assert any(named in f for f in e.guard_failures), e.guard_failures


@pytest.mark.parametrize("case", UNGUARDED, ids=lambda f: f.__name__)
def test_a_read_capture_cannot_guard_runs_eagerly_with_the_reason(case, monkeypatch):
    fn, change, named = case(monkeypatch)
    c = run_case(fn, change)
    fallback = explain(c, X).fallback
    assert fallback is not None and named in fallback and "\n" not in fallback, fallback
    assert "cannot guard" in fallback and c.stats["warm"] == 0, (fallback, c.stats)
