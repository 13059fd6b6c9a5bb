"""Sizes checked against the machine before a command allocates anything.

``optimize`` runs the function before and after its rewrites on seeded random inputs (one
compiled program holding both): that needs at least the inputs, the outputs and the largest
intermediate value of each, a lower bound computed from the traced avals in Python integers (no
overflow, whatever the shapes). Its rewrites may replace every constant (a factory's parameters,
folded in) by a new one while the original graph keeps the old: one more copy of them at most,
since the value check passes constants to the compiled program as they are.
"""
from __future__ import annotations

from mlsys_jax import runtime
from mlsys_jax.ir import aval_bytes as value_bytes


def evaluation_bytes(closed) -> int:
    """A lower bound on the memory of evaluating ``closed`` twice in one program (before and after
    a rewrite): its inputs, plus twice its outputs and its largest intermediate value."""
    j = closed.jaxpr
    inputs = sum(value_bytes(v.aval) for v in j.invars)
    outputs = sum(value_bytes(v.aval) for v in j.outvars)
    largest = max((value_bytes(v.aval) for e in j.eqns for v in e.outvars), default=0)
    return inputs + 2 * (outputs + largest)


def check_evaluation_fits(closed, what: str) -> None:
    """MlsysError (with the estimate and the limit) if evaluating ``closed`` cannot fit."""
    runtime.check_memory(evaluation_bytes(closed), what,
                         "use smaller --arg shapes (the check runs on real random inputs)")


def constant_bytes(closed) -> int:
    """Bytes of a jaxpr's constants (a factory's parameters under ``optimize``)."""
    return sum(value_bytes(v.aval) for v in closed.jaxpr.constvars)


def check_optimize_fits(closed, what: str) -> None:
    """MlsysError (with the estimate and the limit) if ``optimize`` of ``closed`` cannot fit: a
    rewritten copy of its constants beside them, and the value check (the constants themselves
    are in memory already)."""
    consts = constant_bytes(closed)
    runtime.check_memory(consts + evaluation_bytes(closed),
                         f"{what} (a rewritten copy of its {runtime.format_bytes(consts)} of "
                         "constants and the value check)",
                         "use smaller --arg shapes or a smaller model (inspect costs it without "
                         "copying its parameters)")
