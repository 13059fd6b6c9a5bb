"""How many times a ``while`` body runs, when the program says so.

A ``while_loop`` whose counter starts at a literal, moves by a literal step each trip, and is
compared in the condition with a literal (``while i < 10: i += 1``) runs a known number of
trips, and its body's FLOPs count that many times. Any other loop (an adaptive ODE solver, a
counter bounded by a traced value) has a trip count the program does not fix: its body counts
once and the total is a lower bound, which :func:`uncounted_whiles` lets a report say.

>>> import jax, jax.numpy as jnp
>>> jaxpr = jax.make_jaxpr(lambda x: jax.lax.while_loop(
...     lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1])(jnp.ones(3))
>>> static_trips(jaxpr.eqns[0])
10
"""
from __future__ import annotations

import math
import operator

from mlsys_jax.compat import Literal
from mlsys_jax.ir.walk import bodies

# the comparison ``counter OP bound`` keeps looping while true
_COMPARE = {"lt": operator.lt, "le": operator.le, "gt": operator.gt, "ge": operator.ge,
            "ne": operator.ne}
_MAX_TRIPS = 1 << 40  # beyond this, not a loop anyone runs: treated as unknown


def static_trips(eqn) -> int | None:
    """The trip count of a ``while`` equation fixed by literals, else None."""
    if eqn.primitive.name != "while":
        return None
    p = eqn.params
    cond, body = p["cond_jaxpr"].jaxpr, p["body_jaxpr"].jaxpr
    carry_in = eqn.invars[p["cond_nconsts"] + p["body_nconsts"]:]
    if len(cond.eqns) != 1 or cond.eqns[0].primitive.name not in _COMPARE:
        return None
    test = cond.eqns[0]
    carry = cond.invars[p["cond_nconsts"]:]
    a, b = test.invars
    if a in carry and isinstance(b, Literal):
        k, bound, compare = carry.index(a), b.val, _COMPARE[test.primitive.name]
    elif b in carry and isinstance(a, Literal):  # ``bound OP counter``: swap the operands
        k, bound = carry.index(b), a.val
        compare = lambda x, y, op=_COMPARE[test.primitive.name]: op(y, x)  # noqa: E731
    else:
        return None
    start, step = carry_in[k], _step(body, p["body_nconsts"], k)
    if not isinstance(start, Literal) or step is None:
        return None
    return _count(_scalar(start.val), step, _scalar(bound), compare)


def _scalar(v):
    return v.item() if hasattr(v, "item") else v


def _step(body, nconsts: int, k: int):
    """The literal the body adds to (or subtracts from) carry ``k`` each trip, else None."""
    counter, out = body.invars[nconsts + k], body.outvars[k]
    for e in body.eqns:
        if out in e.outvars and e.primitive.name in ("add", "sub"):
            x, y = e.invars
            if x is counter and isinstance(y, Literal):
                return _scalar(y.val) * (1 if e.primitive.name == "add" else -1)
            if y is counter and isinstance(x, Literal) and e.primitive.name == "add":
                return _scalar(x.val)
    return None


def _count(start, step, bound, compare) -> int | None:
    if not compare(start, bound):
        return 0
    if step == 0 or not all(isinstance(v, (int, float)) for v in (start, step, bound)):
        return None
    trips = math.ceil((bound - start) / step) if compare in (operator.lt, operator.gt) \
        else math.floor((bound - start) / step) + 1 if compare is not operator.ne \
        else ((bound - start) / step if (bound - start) % step == 0 else None)
    if trips is None or trips <= 0 or trips > _MAX_TRIPS:
        return None
    trips = int(trips)
    # check the arithmetic against the loop's own test at the last trip and the exit
    last, after = start + (trips - 1) * step, start + trips * step
    return trips if compare(last, bound) and not compare(after, bound) else None


def uncounted_whiles(closed) -> int:
    """``while`` loops (nested bodies included) whose trip count the program does not fix."""
    jaxpr = getattr(closed, "jaxpr", closed)
    count = 0
    for e in jaxpr.eqns:
        if e.primitive.name == "while" and static_trips(e) is None:
            count += 1
        count += sum(uncounted_whiles(b.jaxpr) for b in bodies(e))
    return count
