"""Editing a jaxpr from its equation list: keep JAX's equations, change only what they read.

The structural passes (dce, cse, inline, fold_constants) change which equations a jaxpr holds and
which values they read — never how an equation is bound. So instead of re-tracing every equation
(:func:`ir.rebuild`) they copy the equations JAX built, whose params, literals, effects and weak
types are then exactly JAX's, into a new jaxpr. Only an equation whose input *type* changed is
bound again (:meth:`Editor.retrace`), so JAX's own rules type what follows it.

An :class:`Editor` holds one level: what each original variable now stands for — a variable of
the new jaxpr, a literal, or a known value (:class:`Const`, which becomes a constvar when a kept
equation reads it, as a constant does when JAX traces).
"""
from __future__ import annotations

import jax

from mlsys_jax.compat import (ClosedJaxpr, DropVar, Literal, Var, bind_equation, new_jaxpr,
                              typeof)


class Const:
    """A value known while editing: a constant of the jaxpr (``var`` is its constvar) or a folded
    result. ``aval`` is the type it stands for."""

    __slots__ = ("value", "aval", "var")

    def __init__(self, value, aval, var=None):
        self.value, self.aval, self.var = value, aval, var


def same_type(a, b) -> bool:
    """Shape, dtype and weak_type agree (what a rewrite must keep, TESTING.md §1)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype
                      and getattr(a, "weak_type", False) == getattr(b, "weak_type", False))


def known(value, var) -> Const:
    """``value`` standing for ``var``: typed as ``var`` when shape, dtype and weak_type agree, else
    as the value is (then what reads it is bound again and JAX types the change)."""
    if same_type(value, var.aval):  # a jax.Array carries shape, dtype and weak_type itself
        return Const(value, var.aval)
    return Const(value, typeof(value))


class Editor:
    """Builds a new version of one jaxpr level from its equations (see the module docstring)."""

    def __init__(self, closed):
        self.source = closed
        self.jaxpr = jaxpr = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
        consts = closed.consts if isinstance(closed, ClosedJaxpr) else ()
        # original Var -> Var | Literal | Const (absent: the variable itself)
        self.env = {v: Const(c, v.aval, v) for v, c in zip(jaxpr.constvars, consts)}
        self.retyped: set = set()       # original vars whose new value has another type
        self.eqns: list = []
        self.constvars: list = []
        self.consts: list = []
        self._const_var: dict = {}      # id(value) -> its constvar (JAX dedupes constants so too)
        self.edited = False

    def read(self, v):
        """What ``v`` (an original atom) stands for now."""
        return v if type(v) is Literal else self.env.get(v, v)

    def value(self, v):
        """The known value of ``v`` (a literal or constant), else None."""
        x = self.read(v)
        if type(x) is Literal:
            return x.val
        return x.value if type(x) is Const else None

    def atom(self, x):
        """A Var or Literal of the new jaxpr for ``x`` (a Const becomes a constvar, once)."""
        if type(x) is not Const:
            return x
        var = self._const_var.get(id(x.value))
        if var is None:
            var = x.var if x.var is not None else Var(x.aval)
            self._const_var[id(x.value)] = var
            self.constvars.append(var)
            self.consts.append(x.value)
        return var

    def keep(self, eqn, params=None) -> None:
        """Append ``eqn`` reading the new values of its inputs (the same object when nothing it
        reads changed); bound again when an input's type changed."""
        env, new = self.env, None
        for k, v in enumerate(eqn.invars):
            if type(v) is Literal:
                continue
            x = env.get(v)
            if x is None:
                continue
            a = self.atom(x) if type(x) is Const else x
            if a is v:
                continue
            if new is None:
                new = list(eqn.invars)
            new[k] = a
        if params is not None:
            eqn = eqn.replace(params=params)
        if self.retyped and any(type(v) is not Literal and v in self.retyped for v in eqn.invars):
            self.bind(eqn.outvars, self.retrace(eqn, [self.read(v) for v in eqn.invars]))
            return
        if new is not None:
            eqn = eqn.replace(invars=new)
        self.edited = self.edited or new is not None or params is not None
        self.eqns.append(eqn)

    def bind(self, outvars, values) -> None:
        """The original ``outvars`` now stand for ``values`` (atoms of the new jaxpr or Consts);
        the equation that defined them is dropped."""
        self.edited = True
        for v, x in zip(outvars, values):
            if type(v) is DropVar:
                continue
            self.env[v] = x
            if type(x) is Const and not same_type(x.aval, v.aval):
                self.retyped.add(v)  # e.g. a folded value that lost its weak_type

    def inline(self, body, consts, args) -> list:
        """Copy ``body``'s equations (an open jaxpr with ``consts``) reading ``args`` (atoms or
        Consts), with fresh variables; returns what its outputs stand for."""
        self.edited = True
        sub = {v: Const(c, v.aval) for v, c in zip(body.constvars, consts)}
        sub.update(zip(body.invars, args))
        for eqn in body.eqns:
            invars = [v if type(v) is Literal else self.atom(sub[v]) for v in eqn.invars]
            outvars = [DropVar(v.aval) if type(v) is DropVar else Var(v.aval) for v in eqn.outvars]
            sub.update(zip(eqn.outvars, outvars))
            self.eqns.append(eqn.replace(invars=invars, outvars=outvars))
        return [v if type(v) is Literal else sub[v] for v in body.outvars]

    def retrace(self, eqn, args) -> list:
        """Bind ``eqn`` again on ``args`` (atoms or Consts) under ``jax.make_jaxpr`` and splice the
        result in: params, effects and the output types come out as JAX makes them."""
        atoms = [self.atom(a) for a in args]
        var_pos = [k for k, a in enumerate(atoms) if type(a) is not Literal]
        structs = [jax.ShapeDtypeStruct(atoms[k].aval.shape, atoms[k].aval.dtype,
                                        weak_type=getattr(atoms[k].aval, "weak_type", False))
                   for k in var_pos]

        def again(*xs):
            vals = [a.val if type(a) is Literal else None for a in atoms]
            for k, x in zip(var_pos, xs):
                vals[k] = x
            return bind_equation(eqn, vals)

        frag = jax.make_jaxpr(again)(*structs)
        return self.inline(frag.jaxpr, frag.consts, [atoms[k] for k in var_pos])

    def finish(self):
        """The new level (a ClosedJaxpr), or the original object when nothing was edited."""
        outs = [self.atom(self.read(v)) for v in self.jaxpr.outvars]
        if not self.edited and all(a is v for a, v in zip(outs, self.jaxpr.outvars)):
            return self.source
        return ClosedJaxpr(new_jaxpr(self.jaxpr, self.constvars, outs, self.eqns), self.consts)
