"""How a rule's mutants are written: the *real* pass, run with one of its module's attributes
patched for the duration of one call (a function of the fold algebra, NumPy's ``concatenate`` as
the rule's module sees it), never by editing its source (docs/verification.md §4)."""
from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass, field
from typing import Callable

from mlsys_jax.passes.core import Pass


@dataclass(frozen=True)
class RuleMutant:
    """A broken variant of a rule: its name, how to build the broken pass, what it gets wrong,
    and the fuzz campaign's knobs (``fuzz.spec.Knobs`` fields) for the only programs it can differ
    on (empty: the default mix)."""

    name: str
    make: Callable[[], Pass]
    what: str
    knobs: dict = field(default_factory=dict)


@contextlib.contextmanager
def patched(obj, name: str, value):
    """Temporarily replace ``obj.name`` (restored even on error)."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def during(real: Pass, *patches) -> Pass:
    """A Pass running ``real`` with ``patches`` [(obj, name, value)] applied."""
    def fn(closed):
        with contextlib.ExitStack() as stack:
            for obj, name, value in patches:
                stack.enter_context(patched(obj, name, value))
            return real(closed)
    return Pass(real.name, fn)


def proxy(module, **overrides):
    """A stand-in for ``module`` (numpy, jax.numpy) with some functions replaced: ``overrides``
    maps a name to a function of the real one."""
    ns = types.SimpleNamespace(**{k: getattr(module, k) for k in dir(module)
                                  if not k.startswith("__")})
    for k, f in overrides.items():
        setattr(ns, k, f(getattr(module, k)))
    return ns
