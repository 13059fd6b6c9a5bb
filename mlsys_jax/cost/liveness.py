"""Liveness-based peak memory of a jaxpr (lecture §3.2, §7.1: activations live until last use).

Convention (the graph executor of ``mlsys_jax.execute`` follows the same one): walk the top-level
equations in program order. Inputs and constants are live from the start until their last use;
a value produced by equation i is live from i until its last consumer has run; outputs of the
jaxpr stay live to the end; a value nobody uses is freed right after it is produced. The bytes
live *while* equation i runs are its inputs (not yet freed), its outputs, and everything still
needed later.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlsys_jax.compat import ClosedJaxpr, Var
from mlsys_jax.ir.trace import aval_bytes, parse_dtype, shape_str


@dataclass(frozen=True)
class Liveness:
    """Bytes live during each equation, the peak, where it happens and which values make it."""

    timeline: tuple
    peak_bytes: int
    peak_at: int
    live_at_peak: tuple  # (value as text, bytes), largest first

    def __repr__(self) -> str:
        return f"Liveness(peak_bytes={self.peak_bytes}, peak_at={self.peak_at})"


def last_uses(jaxpr) -> dict:
    """var -> index of the last equation that reads it (len(eqns) for jaxpr outputs)."""
    last: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                last[v] = i
    for v in jaxpr.outvars:
        if isinstance(v, Var):
            last[v] = len(jaxpr.eqns)
    return last


def liveness(closed, dtype=None, include_inputs: bool = True) -> Liveness:
    """Peak live bytes of a jaxpr's top level (nested bodies count as their outputs).

    >>> import jax.numpy as jnp
    >>> from mlsys_jax import ir
    >>> liveness(ir.trace(lambda x: jnp.sin(x).sum(), "f32[1024]")).peak_bytes  # x and sin(x)
    8192
    """
    cost_dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    jaxpr = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    last = last_uses(jaxpr)
    size = lambda v: aval_bytes(v.aval, cost_dtype)  # noqa: E731
    live: dict = {}
    if include_inputs:
        for v in list(jaxpr.constvars) + list(jaxpr.invars):
            if v in last:
                live[v] = size(v)
    timeline, peak, peak_at, peak_set = [], 0, -1, {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.outvars:
            if isinstance(v, Var) and not type(v).__name__ == "DropVar":
                live[v] = size(v)
        now = sum(live.values())
        timeline.append(now)
        if now > peak:
            peak, peak_at, peak_set = now, i, dict(live)
        for v in list(eqn.invars) + list(eqn.outvars):
            if isinstance(v, Var) and v in live and last.get(v, -1) <= i:
                del live[v]
    top = sorted(((str(v) + ":" + shape_str(v.aval), b) for v, b in peak_set.items()),
                 key=lambda t: -t[1])
    return Liveness(tuple(timeline), peak, peak_at, tuple(top))
