"""A context variable set for the duration of a ``with`` block: the one way the package scopes a
setting to the code a caller runs (validation on or off, a cut being traced, a time bound)."""
from __future__ import annotations

import contextlib
from contextvars import ContextVar


@contextlib.contextmanager
def setting(var: ContextVar, value):
    """Inside, ``var`` holds ``value``; after, what it held before (nested blocks unwind in turn).

    >>> from contextvars import ContextVar
    >>> on = ContextVar("on", default=False)
    >>> with setting(on, True):
    ...     on.get()
    True
    >>> on.get()
    False
    """
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)
