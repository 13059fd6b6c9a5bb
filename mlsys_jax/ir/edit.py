"""Editing a jaxpr from its equation list: keep JAX's equations, change only what they read.

The structural passes (dce, cse, inline, fold_constants) change which equations a jaxpr holds and
which values they read — never how an equation is bound. So instead of re-tracing every equation
(:func:`ir.rebuild`) they copy the equations JAX built, whose params, literals, effects and weak
types are then exactly JAX's, into a new jaxpr. Only an equation whose input *type* changed is
bound again (:meth:`Editor.retrace`), so JAX's own rules type what follows it.

An :class:`Editor` holds one level: what each original variable now stands for — a variable of
the new jaxpr, a literal, a known value (:class:`Const`, which becomes a constvar when a kept
equation reads it, as a constant does when JAX traces), or a tracer of a ``compat.Fragment`` (a
numeric rewrite's replacement, traced by itself; :meth:`Editor.splice` marks where its equations
go, :meth:`Editor.finish` puts them there).
"""
from __future__ import annotations

import jax

from mlsys_jax.compat import (ClosedJaxpr, DropVar, Literal, Tracer, Var, bind_equation,
                              dce_jaxpr_consts, new_jaxpr, typeof)


class Const:
    """A value known while editing: a constant of the jaxpr (``var`` is its constvar) or a folded
    result. ``aval`` is the type it stands for."""

    __slots__ = ("value", "aval", "var")

    def __init__(self, value, aval, var=None):
        self.value, self.aval, self.var = value, aval, var


def same_type(a, b) -> bool:
    """Shape, dtype and weak_type agree (what a rewrite must keep: the verifier checks them)."""
    return a is b or (a.shape == b.shape and a.dtype == b.dtype
                      and getattr(a, "weak_type", False) == getattr(b, "weak_type", False))


def known(value, var) -> Const:
    """``value`` standing for ``var``: typed as ``var`` when shape, dtype and weak_type agree, else
    as the value is (then what reads it is bound again and JAX types the change). A JAX 0.10
    typed literal (``TypedFloat``, ``TypedInt``: a Python scalar with a dtype, what
    ``1 - lax.stop_gradient(0.1)`` folds to) becomes the array it stands for."""
    if not hasattr(value, "shape"):
        value = jax.numpy.asarray(value)  # keeps its dtype and weak type
    if not hasattr(value, "weak_type") and value.shape == var.aval.shape \
            and value.dtype == var.aval.dtype:
        return Const(value, var.aval)  # a NumPy array has no weak type: it takes var's
    if same_type(value, var.aval):  # a jax.Array carries shape, dtype and weak_type itself
        return Const(value, var.aval)
    return Const(value, typeof(value))


class Splice:
    """Where the equations a fragment recorded in positions [start, stop) go."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop


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
        self.pending = False            # some equation or output reads a fragment's tracer

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
            if isinstance(a, Tracer):
                self.pending = True
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
            if type(x) is not Var and not same_type(x.aval, v.aval):
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

    def splice(self, start: int, stop: int) -> None:
        """The equations a fragment recorded in [start, stop) go here."""
        self.edited = True
        self.eqns.append(Splice(start, stop))

    def finish(self, fragment=None, args=()):
        """The new level (a ClosedJaxpr), or the original object when nothing was edited.
        ``fragment`` (with ``args``, the atoms its inputs stand for) supplies spliced equations
        and the values of tracers."""
        outs = [self.atom(self.read(v)) for v in self.jaxpr.outvars]
        if not self.edited and all(a is v for a, v in zip(outs, self.jaxpr.outvars)):
            return self.source
        eqns = self.eqns
        if fragment is not None and (self.pending or any(isinstance(a, Tracer) for a in outs)
                                     or any(type(e) is Splice for e in eqns)):
            eqns, outs = self._resolve(fragment, args, outs)
        return ClosedJaxpr(new_jaxpr(self.jaxpr, self.constvars, outs, eqns), self.consts)

    def _resolve(self, fragment, args, outs) -> tuple:
        """Trace the fragment to a jaxpr; splice its equations; tracers become its outputs."""
        tracers, seen = [], set()
        for x in [v for e in self.eqns if type(e) is not Splice for v in e.invars] + outs:
            if isinstance(x, Tracer) and id(x) not in seen:
                seen.add(id(x))
                tracers.append(x)
        frag, consts = fragment.finish(tracers)
        sub = dict(zip(frag.invars, args))
        sub.update((v, self.atom(Const(c, v.aval))) for v, c in zip(frag.constvars, consts))

        def new(x):
            return x if type(x) is Literal else sub.get(x, x)

        recorded = [e.replace(invars=[new(v) for v in e.invars]) for e in frag.eqns]
        value = {id(t): new(o) for t, o in zip(tracers, frag.outvars)}

        def resolved(x):
            return value[id(x)] if isinstance(x, Tracer) else x

        eqns = []
        for e in self.eqns:
            if type(e) is Splice:
                eqns += recorded[e.start:e.stop]
            elif any(isinstance(v, Tracer) for v in e.invars):
                eqns.append(e.replace(invars=[resolved(v) for v in e.invars]))
            else:
                eqns.append(e)
        outs = [resolved(a) for a in outs]
        self._order_constants(v for e in eqns for v in e.invars)
        return eqns, outs

    def _order_constants(self, reads) -> None:
        """Constvars in order of first use, as JAX's tracer makes them (spliced equations
        materialise theirs last)."""
        where = {v: k for k, v in enumerate(self.constvars)}
        order = []
        for v in list(reads) + list(self.constvars):
            k = where.pop(v, None) if type(v) is Var else None
            if k is not None:
                order.append(k)
        self.constvars = [self.constvars[k] for k in order]
        self.consts = [self.consts[k] for k in order]


def dce_jaxpr(closed: ClosedJaxpr) -> ClosedJaxpr:
    """Remove equations no output needs (JAX's own DCE rules: effects kept, bodies pruned)."""
    n = len(closed.jaxpr.constvars)
    new, used_consts, _ = dce_jaxpr_consts(closed.jaxpr, [True] * len(closed.jaxpr.outvars),
                                           instantiate=[False] * n + [True] * len(closed.jaxpr.invars))
    consts = [c for c, u in zip(closed.consts, used_consts) if u]
    return ClosedJaxpr(new, consts)
