"""The rewrite rules, one module each (docs/architecture.md "Adding a rule").

A rule module is the whole rule: its anchor pattern (``match``), its preconditions (named
``Precondition``\\ s), its emit, the fuzzer's motif that makes it fire and its mutants (broken
variants the fuzzer's oracles must catch), all in its ``RULE``, plus the public factory named
like the module (``fold_conv_bn()``). The registry finds every module here (:func:`modules`),
and :mod:`mlsys_jax.passes` exports each factory: adding a rule is adding its module (and its
test). The machinery they share is :mod:`mlsys_jax.passes.rewrite`.
"""
from __future__ import annotations

import importlib
import pkgutil


def modules() -> list:
    """Every rule module, in name order (each holds a ``RULE`` and its factory)."""
    found = [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)
             if not m.name.startswith("_")]
    return sorted((m for m in found if hasattr(m, "RULE")), key=lambda m: m.__name__)

__all__ = ["modules"]
