"""The one walk into nested bodies (jit, cond, scan, while, remat, custom_jvp/vjp, shard_map) and
the one equation-path format.

A path names an equation: its index, and for an equation inside a body, the path of the equation
holding the body, the body's label and the index inside it: ``"3/jit[softmax_xent]/0"``,
``"1/cond.branches[1]/2"``, ``"4/scan.jaxpr/0"``. ``ir.walk`` yields these paths and the passes log
rewrites and refusals with them, so a rewrite's ``where`` names an equation of the original.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterator, NamedTuple

from mlsys_jax.compat import ClosedJaxpr, Jaxpr, call_name
from mlsys_jax.ir.primitives import ARRAY_OPS


class Body(NamedTuple):
    """One jaxpr held in an equation's params."""

    param: str            # the param holding it: "jaxpr", "call_jaxpr", "branches", ...
    index: int | None     # its position when the param is a tuple (cond's branches), else None
    jaxpr: Jaxpr          # the open jaxpr
    consts: tuple         # its constants (empty for an open Jaxpr param)
    label: str            # its path component: "jit[relu]", "cond.branches[1]", "remat2.jaxpr"
    is_closed: bool       # the param holds a ClosedJaxpr (remat2 and shard_map hold open ones)


_JAXPRS = (ClosedJaxpr, Jaxpr)


def _open(j) -> Jaxpr:
    return j.jaxpr if isinstance(j, ClosedJaxpr) else j


def bodies(eqn) -> list[Body]:
    """The nested bodies of an equation, in param order (empty for a primitive without bodies).

    A body's label is ``prim[name]`` when the equation is a named call with one body, else
    ``prim.param`` with ``[index]`` for tuple params.
    """
    if eqn.primitive.name in ARRAY_OPS:  # hot: walks and passes ask this of every equation
        return []
    found = []
    for pname, val in eqn.params.items():
        if isinstance(val, (tuple, list)):
            found += [(pname, i, item) for i, item in enumerate(val)
                      if isinstance(item, _JAXPRS)]
        elif isinstance(val, _JAXPRS):
            found.append((pname, None, val))
    if not found:
        return []
    name = call_name(eqn) if len(found) == 1 else None
    prim = eqn.primitive.name
    out = []
    for pname, idx, item in found:
        label = (f"{prim}[{name}]" if name
                 else f"{prim}.{pname}" + (f"[{idx}]" if idx is not None else ""))
        closed = isinstance(item, ClosedJaxpr)
        out.append(Body(pname, idx, _open(item), tuple(item.consts) if closed else (), label,
                        closed))
    return out


def body_path(here: str, body: Body) -> str:
    """The path prefix of the equations inside ``body`` of the equation at ``here``."""
    return f"{here}/{body.label}/"


def walk(closed, path: str = "") -> Iterator[tuple[str, object]]:
    """Yield ``(path, eqn)`` for every equation, recursively into nested bodies."""
    for i, eqn in enumerate(_open(closed).eqns):
        here = f"{path}{i}"
        yield here, eqn
        for body in bodies(eqn):  # (walk_eqn inlined: one generator per level, not per equation)
            yield from walk(body.jaxpr, body_path(here, body))


def equations(closed) -> Iterator:
    """Every equation, recursively into nested bodies, as :func:`walk` orders them but without
    building paths (a string per equation): for questions like "is there a conv anywhere?"."""
    for eqn in _open(closed).eqns:
        yield eqn
        for body in bodies(eqn):
            yield from equations(body.jaxpr)


def walk_eqn(eqn, here: str = "") -> Iterator[tuple[str, object]]:
    """Yield ``(here, eqn)`` and then every equation nested in its bodies, with their paths."""
    yield here, eqn
    for body in bodies(eqn):
        yield from walk(body.jaxpr, body_path(here, body))


def primitive_counts(closed, recursive: bool = True) -> Counter:
    """How many times each primitive appears (into nested bodies when ``recursive``)."""
    if recursive:
        return Counter(eqn.primitive.name for _, eqn in walk(closed))
    return Counter(eqn.primitive.name for eqn in _open(closed).eqns)
