"""The verifier run after every pass that changed something (docs/verification.md §1, like XLA's HloVerifier).

``check_jaxpr`` misses weak_type flips, dropped effects and stale nested params, so we check those
too. Every failure names the pass.

A :class:`Checker` verifies the graphs of one ``passes.run`` incrementally, by object identity
(it holds every graph it saw, so ids stay unique): a jaxpr level it has verified — or that came
from JAX's tracer as the run's input — is not checked again, and in a new level only equations it
has not seen typed are type-checked by JAX. An equation is known well-typed when it is one seen
before, or when it binds the same primitive with the same params to inputs and outputs of the same
types as one seen before (bodies may differ if their types do not): its types are then what JAX
already checked. What a level is made of (scoping, outputs, effects) is checked in full.
"""
from __future__ import annotations

from collections import Counter
from itertools import chain
from operator import attrgetter

from mlsys_jax.compat import (ClosedJaxpr, DropVar, Jaxpr, Literal, Var, check_equation,
                              effects_declared, literal_fits)
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.keys import signature
from mlsys_jax.ir.primitives import ARRAY_OPS, JIT
from mlsys_jax.ir.walk import bodies, walk


class VerificationError(AssertionError):
    """A pass produced a jaxpr that is malformed or computes a different signature/effects."""


def effect_multiset(closed) -> Counter:
    """Effectful equations over all nested bodies: (primitive, effects) with multiplicity."""
    return Counter(_effect_entry(e) for _, e in walk(closed) if e.effects)


def _effect_entry(eqn) -> tuple:
    return eqn.primitive.name, tuple(sorted(map(str, eqn.effects)))


def require_static_shapes(closed, api: str = "passes") -> None:
    """Symbolic (shape-polymorphic) dimensions are refused with a clear error."""
    for v in list(closed.jaxpr.invars) + list(closed.jaxpr.outvars):
        for d in getattr(v.aval, "shape", ()):
            if not isinstance(d, int):
                raise MlsysError(f"{api}: symbolic dimension {d!r} in {v.aval.str_short()}; the "
                                 "passes need static shapes. Trace with concrete shapes.")


def _nested_param_errors(eqn) -> list[str]:
    p, name, errs = eqn.params, eqn.primitive.name, []
    nin = len(eqn.invars)
    if name in JIT:
        body = p["jaxpr"]
        for key in ("in_shardings", "donated_invars", "in_layouts"):
            if key in p and len(p[key]) != len(body.jaxpr.invars):
                errs.append(f"jit.{key} has {len(p[key])} entries for {len(body.jaxpr.invars)} inputs")
        if len(body.jaxpr.invars) != nin:
            errs.append(f"jit body takes {len(body.jaxpr.invars)} inputs, call passes {nin}")
    elif name == "scan":
        body = p["jaxpr"].jaxpr
        if len(body.invars) != nin or p["num_consts"] + p["num_carry"] > nin:
            errs.append("scan num_consts/num_carry disagree with its body")
    elif name == "while":
        if len(p["cond_jaxpr"].jaxpr.invars) != nin - p["body_nconsts"]:
            errs.append("while cond_nconsts disagrees with cond_jaxpr")
        if len(p["body_jaxpr"].jaxpr.invars) != nin - p["cond_nconsts"]:
            errs.append("while body_nconsts disagrees with body_jaxpr")
    elif name == "cond":
        sigs = {tuple(str(v.aval) for v in b.jaxpr.outvars) for b in p["branches"]}
        if len(sigs) > 1:
            errs.append("cond branches disagree on output types")
        if any(len(b.jaxpr.invars) != nin - 1 for b in p["branches"]):
            errs.append("cond branch arity disagrees with the operands")
    return errs


class Bad(Exception):
    """What is wrong with a jaxpr (the verifier names the pass)."""


_JAXPRS = (ClosedJaxpr, Jaxpr)


def _avals(vs) -> list:
    return [v.aval for v in vs]


def _body_type(j) -> tuple:
    j = j.jaxpr if isinstance(j, ClosedJaxpr) else j
    return _avals(j.invars), _avals(j.outvars), j.effects


class Checker:
    """What one run has verified (see the module docstring)."""

    def __init__(self):
        self._levels: dict = {}   # id(Jaxpr) -> (Jaxpr, Counter of effectful eqns, nested too)
        self._typed: set = set()  # ids of equations known well-typed (their levels are held)
        self._nested: dict = {}   # id(typed eqn with bodies) -> Counter of effectful eqns inside
        self._by_params: dict | None = None   # id(params) -> a typed eqn (built when needed)
        self._by_output: dict | None = None   # id(first outvar) -> the typed eqn defining it

    def trust(self, closed) -> Counter:
        """Record a graph that JAX built (the run's input) as well-formed, without checking it;
        returns its effect multiset."""
        return self._level(_open(closed), trusted=True)

    def check(self, closed) -> Counter:
        """Verify ``closed`` (raises :class:`Bad`); returns its effect multiset."""
        if len(closed.consts) != len(closed.jaxpr.constvars):
            raise Bad(f"{len(closed.consts)} consts for {len(closed.jaxpr.constvars)} constvars")
        return self._level(closed.jaxpr, trusted=False)

    def _level(self, jaxpr, trusted: bool) -> Counter:
        hit = self._levels.get(id(jaxpr))
        if hit is not None:
            return hit[1]
        if not trusted:
            _check_scopes(jaxpr)
        effects = Counter(_effect_entry(e) for e in jaxpr.eqns if e.effects)
        if effects and not trusted and not effects_declared(jaxpr):
            raise Bad("an equation's effect is missing from the jaxpr's effects")
        typed, nested = self._typed, self._nested
        for eqn in jaxpr.eqns:
            if id(eqn) not in typed:
                self._new_eqn(eqn, trusted)
            inner = nested.get(id(eqn))
            if inner:
                effects.update(inner)
        self._levels[id(jaxpr)] = (jaxpr, effects)
        if self._by_params is not None:
            self._index(jaxpr.eqns)
        return effects

    def _new_eqn(self, eqn, trusted: bool) -> None:
        """Type-check an equation not seen before (and its bodies) and record it."""
        subs = bodies(eqn)
        if not trusted and not self._typed_like_known(eqn):
            try:
                check_equation(eqn)
            except Exception as e:  # JaxprTypeError and friends
                msg = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise Bad(f"check_jaxpr failed: {msg}") from None
        if subs:
            inner = Counter()
            for b in subs:
                if b.is_closed and len(b.consts) != len(b.jaxpr.constvars):
                    raise Bad(f"{b.label}: {len(b.consts)} consts for "
                              f"{len(b.jaxpr.constvars)} constvars")
                inner.update(self._level(b.jaxpr, trusted))
            errs = [] if trusted else _nested_param_errors(eqn)
            if errs:
                raise Bad(errs[0])
            self._nested[id(eqn)] = inner
        self._typed.add(id(eqn))

    def _index(self, eqns) -> None:
        self._by_params.update(zip(map(id, map(_PARAMS, eqns)), eqns))
        self._by_output.update((id(e.outvars[0]), e) for e in eqns if e.outvars)

    def _typed_like_known(self, eqn) -> bool:
        """Same primitive, params (bodies aside, if of the same types), effects and input/output
        types as an equation already typed: JAX's type rules give it the same types."""
        if self._by_params is None:
            self._by_params, self._by_output = {}, {}
            for j, _ in self._levels.values():
                self._index(j.eqns)
        ref = self._by_params.get(id(eqn.params))
        if ref is None and eqn.outvars:
            ref = self._by_output.get(id(eqn.outvars[0]))
        if (ref is None or ref.primitive is not eqn.primitive or ref.effects != eqn.effects
                or len(ref.invars) != len(eqn.invars)
                or (ref.outvars is not eqn.outvars and _avals(ref.outvars) != _avals(eqn.outvars))):
            return False
        for v, r in zip(eqn.invars, ref.invars):  # usually all but one are the same variables
            if v is not r and (v.aval != r.aval or type(v) is Literal and not literal_fits(v)):
                return False
        if ref.params is eqn.params:
            return True
        if ref.params.keys() != eqn.params.keys():
            return False
        return all(new is ref.params[k] or _same_body_types(ref.params[k], new)
                   for k, new in eqn.params.items())


def _check_scopes(jaxpr) -> None:
    """Every variable is bound once and read after it is bound; outputs are bound."""
    defined = set(jaxpr.constvars)
    defined.update(jaxpr.invars)
    if len(defined) != len(jaxpr.constvars) + len(jaxpr.invars):
        raise Bad("an input variable is bound twice")
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if type(v) is not Literal and (type(v) is not Var or v not in defined):
                raise Bad(f"{eqn.primitive.name} reads a variable that is not defined")
        for v in eqn.outvars:
            if type(v) is not DropVar:
                if type(v) is not Var or v in defined:
                    raise Bad(f"{eqn.primitive.name} binds a variable that is already bound "
                              "(or not a variable)")
                defined.add(v)
    for v in jaxpr.outvars:
        if (v not in defined) if type(v) is not Literal else not literal_fits(v):
            raise Bad("an output variable is not defined (or a literal output mistyped)")


def _same_body_types(old, new) -> bool:
    """Two param values that are the same, or bodies (tuples of bodies) of equal types."""
    olds = old if isinstance(old, (tuple, list)) else (old,)
    news = new if isinstance(new, (tuple, list)) else (new,)
    return len(olds) == len(news) and all(
        o is n or (isinstance(o, _JAXPRS) and type(o) is type(n) and _body_type(o) == _body_type(n))
        for o, n in zip(olds, news))


_PARAMS = attrgetter("params")
_FIELDS = tuple(map(attrgetter, ("primitive", "effects", "params", "invars", "outvars")))
_INVARS, _OUTVARS = attrgetter("invars"), attrgetter("outvars")


def fingerprint(closed) -> list:
    """Which objects a graph is made of, at every level: equal before and after a pass exactly
    when the pass left its input alone (lists, dicts and equations can be mutated in place).
    Built by C-level maps into a few flat lists (cheap for the garbage collector) and compared
    with ``==``, which is identity for Vars, Literals, primitives and bodies: each equation's
    fields, inputs and outputs (with their counts), and its params' keys and values."""
    return list(_parts(closed))


def unchanged_since(closed, before: list) -> bool:
    """``fingerprint(closed) == before``, built and compared part by part: each part is dropped
    once compared (a whole second fingerprint of a big graph never sits in memory), and the
    first difference ends the check."""
    n = 0
    try:
        for n, part in enumerate(_parts(closed), 1):
            if n > len(before) or not (part is before[n - 1] or part == before[n - 1]):
                return False
    except Exception:  # a params value that was replaced and has no plain == (an array)
        return False
    return n == len(before)


def _parts(closed):
    seen, todo = set(), [closed]
    while todo:
        j = todo.pop()
        if id(j) in seen:
            continue
        seen.add(id(j))
        if isinstance(j, ClosedJaxpr):
            yield j
            yield list(map(id, j.consts))
            j = j.jaxpr
        eqns = j.eqns
        yield from (j, list(j.constvars), list(j.invars), list(j.outvars), j.effects, list(eqns))
        for k in range(0, len(eqns), _BLOCK):
            yield from _block_parts(eqns[k:k + _BLOCK])
        for e in eqns:
            if e.primitive.name not in ARRAY_OPS:
                todo += [b.jaxpr for b in bodies(e)]


# Equations per block of the fingerprint: a block is swept once per part (C-level maps), so its
# equations, lists and dicts must stay in the CPU's cache between sweeps — else a 10,000-equation
# graph is fetched from memory once per part, and the check costs more per equation the bigger
# the graph.
_BLOCK = 256


def _block_parts(eqns: list) -> list:
    params = list(map(_PARAMS, eqns))
    return [*[list(map(f, eqns)) for f in _FIELDS],
            list(map(len, map(_INVARS, eqns))), list(chain.from_iterable(map(_INVARS, eqns))),
            list(map(len, map(_OUTVARS, eqns))), list(chain.from_iterable(map(_OUTVARS, eqns))),
            list(map(len, params)), list(chain.from_iterable(map(dict.keys, params))),
            list(chain.from_iterable(map(dict.values, params)))]


def _open(closed):
    return closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed


def verify(pass_name: str, before: ClosedJaxpr, after: ClosedJaxpr, claimed_changed: bool,
           checker: Checker | None = None) -> None:
    """Raise VerificationError (naming ``pass_name``) unless ``after`` is a valid replacement for
    ``before`` (which is trusted). ``checker`` carries what this run verified already."""
    def fail(msg):
        raise VerificationError(f"verifier: pass {pass_name!r}: {msg}")

    checker = checker or Checker()
    eb = checker.trust(before)
    if not claimed_changed:
        return
    try:
        ea = checker.check(after)
    except Bad as e:
        fail(str(e))
    if signature(before) != signature(after):
        fail(f"signature changed: {signature(before)} -> {signature(after)}")
    if eb != ea:
        fail(f"effectful equations changed: {dict(eb)} -> {dict(ea)}")
    require_static_shapes(after, pass_name)
