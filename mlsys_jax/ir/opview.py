"""The op view: a jaxpr seen at the granularity a user wrote it (lecture §2.1, §8.1 demo 2).

A top-level named call (``jit[name=softmax_xent]``, ``custom_jvp_call[name=relu]``) is one op;
elsewhere one primitive is one op, except that shape-only equations (broadcast_in_dim, reshape,
squeeze, expand_dims, a convert of a literal) whose only consumer is an elementwise op belong to
that op — broadcasting is free in every eager framework, so ``x @ W + b`` is two ops, not three.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from mlsys_jax.compat import ClosedJaxpr, DropVar, Literal, Var, call_name, nested_source_info
from mlsys_jax.ir.primitives import ELEMENTWISE, NAMED_CALLS, SHAPE_ONLY
from mlsys_jax.ir.walk import bodies, body_path, walk_eqn

LECTURE_NAMES = {"dot_general": "matmul", "conv_general_dilated": "conv"}


@dataclass(frozen=True)
class Op:
    """One op of the op view: its name, equations (program order), external inputs and outputs."""

    name: str
    eqns: tuple
    invars: tuple
    outvars: tuple

    @property
    def primitives(self) -> tuple[str, ...]:
        """All primitive names inside the op, recursively."""
        out = []
        for eqn in self.eqns:
            out += [e.primitive.name for _, e in walk_eqn(eqn)]
        return tuple(out)

    @property
    def main(self):
        """The equation that names the op (the last one; absorbed shape ops come first)."""
        return self.eqns[-1]


def op_name(eqn) -> str:
    """The lecture's name of an equation: a named call's name, ``matmul``, ``conv``, or the primitive."""
    name = call_name(eqn) if eqn.primitive.name in NAMED_CALLS else None
    if name:
        return name
    return LECTURE_NAMES.get(eqn.primitive.name, eqn.primitive.name)


def is_elementwise_op(eqn) -> bool:
    """Whether an equation works element by element (a named call counts when all of its body does)."""
    if eqn.primitive.name in ELEMENTWISE:
        return True
    if eqn.primitive.name in NAMED_CALLS:  # a named op made only of elementwise/shape work
        inner = [e.primitive.name for _, e in walk_eqn(eqn)][1:]
        return bool(inner) and all(p in ELEMENTWISE | SHAPE_ONLY | NAMED_CALLS for p in inner)
    return False


def _is_shape_only(eqn) -> bool:
    if eqn.primitive.name in SHAPE_ONLY:
        return True
    return (eqn.primitive.name == "convert_element_type"
            and all(isinstance(v, Literal) for v in eqn.invars))


def consumers(jaxpr) -> dict:
    """var -> list of consuming equation indices (-1 for a jaxpr output)."""
    users: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                users.setdefault(v, []).append(i)
    for v in jaxpr.outvars:
        if isinstance(v, Var):
            users.setdefault(v, []).append(-1)
    return users


def op_view(closed) -> list[Op]:
    """The ops of a jaxpr's top level, in program order."""
    jaxpr = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    eqns = jaxpr.eqns
    users = consumers(jaxpr)
    owner = list(range(len(eqns)))  # eqn index -> index of the eqn whose op it belongs to
    for i in reversed(range(len(eqns))):
        eqn = eqns[i]
        if not _is_shape_only(eqn) or len(eqn.outvars) != 1:
            continue
        us = users.get(eqn.outvars[0], [])
        if len(us) == 1 and us[0] >= 0:
            j = owner[us[0]]
            if is_elementwise_op(eqns[j]):
                owner[i] = j
    members: dict[int, list[int]] = {}
    for i, o in enumerate(owner):
        members.setdefault(o, []).append(i)
    ops = []
    for head in sorted(members):
        idx = members[head]
        ops.append(_make_op(jaxpr, [eqns[i] for i in idx], users, set(idx)))
    return ops


def _make_op(jaxpr, op_eqns, users, idx_set) -> Op:
    defined = {v for e in op_eqns for v in e.outvars}
    invars, seen = [], set()
    for e in op_eqns:
        for v in e.invars:
            if isinstance(v, Var) and v not in defined and v not in seen:
                seen.add(v)
                invars.append(v)
    # Written by the kernel: used outside the op, returned, or unused (dead values are still written).
    outvars = [v for e in op_eqns for v in e.outvars
               if not users.get(v) or any(u < 0 or u not in idx_set for u in users[v])]
    return Op(op_name(op_eqns[-1]), tuple(op_eqns), tuple(invars), tuple(outvars))


@dataclass(frozen=True)
class EqnView:
    """Equations and outputs of a jaxpr's top level, seen with some calls opened: what
    :func:`op_view` and the cost model read (``eqns``, ``outvars``). A view, never a program to
    run: its equations are the original ones with variables renamed, and those of an opened body
    carry the call's name stack before their own, as when JAX inlines a body. ``paths`` gives each
    equation's path in the original (``ir.walk``'s format)."""

    eqns: tuple
    outvars: tuple
    paths: tuple = ()


def open_calls(closed, should_open: Callable) -> EqnView:
    """The top level of ``closed`` with every named call for which ``should_open(eqn)`` holds
    replaced by its body's equations, recursively (the cost model opens a jitted model that is
    not one kernel, so it costs what the unjitted model costs). Each opened body gets fresh
    variables, so two calls of one traced body stay two sets of values; a body's inputs become
    the call's arguments and its outputs the call's results."""
    jaxpr = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    rename: dict = {}
    eqns, paths = [], []
    _open_eqns(jaxpr.eqns, rename, should_open, eqns, paths)
    return EqnView(tuple(eqns), tuple(_sub(rename, v) for v in jaxpr.outvars), tuple(paths))


def _sub(rename, v):
    return rename.get(v, v) if isinstance(v, Var) else v


def _open_eqns(eqns, rename: dict, should_open, out: list, paths: list, path: str = "",
               outer=None) -> None:
    for i, eqn in enumerate(eqns):
        invars = [_sub(rename, v) for v in eqn.invars]
        outvars = [rename.get(v, v) for v in eqn.outvars]
        found = bodies(eqn) if eqn.primitive.name in NAMED_CALLS else []
        source = eqn.source_info if outer is None else nested_source_info(outer, eqn.source_info)
        if len(found) != 1 or not should_open(eqn):
            if invars != list(eqn.invars) or outvars != list(eqn.outvars) or outer is not None:
                eqn = eqn.replace(invars=invars, outvars=outvars, source_info=source)
            out.append(eqn)
            paths.append(f"{path}{i}")
            continue
        body = found[0].jaxpr
        inner = dict(zip(body.invars, invars))
        produced = {v for e in body.eqns for v in e.outvars}
        for bo, original, oo in zip(body.outvars, eqn.outvars, outvars):
            if isinstance(oo, DropVar):
                continue
            if isinstance(bo, Var) and bo in produced and bo not in inner:
                inner[bo] = oo  # the body's result is written as the call's result
            else:
                rename[original] = _sub(inner, bo)  # an input or constant passed through
        for e in body.eqns:  # every other value of the body: a fresh variable per call
            for v in e.outvars:
                if v not in inner and not isinstance(v, DropVar):
                    inner[v] = Var(v.aval)
        _open_eqns(body.eqns, inner, should_open, out, paths, body_path(f"{path}{i}", found[0]),
                   source)
