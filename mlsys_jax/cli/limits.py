"""Sizes checked against the machine before a command allocates anything.

``optimize`` runs the function before and after its rewrites on seeded random inputs (one
compiled program holding both): that needs at least the inputs, the outputs and the largest
intermediate value of each, a lower bound computed from the traced avals in Python integers (no
overflow, whatever the shapes).
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
