"""What a rewrite rule is, and how one becomes a pass (docs/architecture.md "Adding a rule").

A :class:`Rule` is one module's rewrite: ``match(level, **options)`` finds its anchor pattern at
one jaxpr level and yields :class:`Match`es (the equations it would replace, the values it
replaces, what it would do) and :class:`Refused` anchors (matched, but a check failed while the
pattern was followed); ``checks`` are its preconditions on a whole match, each named, each
returning None or the reason it refuses; ``emit(match, em)`` computes the replacement values with
ordinary JAX code through an ``Emit`` (``rewrite/level.py``), once at the program's dtypes and, for
translation validation, once in float64. The rest is its registry entry: kind, whether the search
may use it, and an exactness caveat ("exact for finite inputs") that its log lines carry and the
fuzzer's oracles honour.

``rule.make_pass(only=None, **options)`` is the pass. At every level it matches, checks, places
each match (its replacement goes where all its inputs exist and before anything outside reads
its outputs), validates it on its region when validation is on (``passes/validate.py``), and
splices the replacements in (``engine.transform``); then DCE drops what they made dead. ``only=k``
applies the k-th top-level match alone (the search's moves).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import jax

from mlsys_jax.compat import Literal
from mlsys_jax.ir.walk import bodies, body_path, equations
from mlsys_jax.ir.edit import dce_jaxpr
from mlsys_jax.passes.core import Log, Pass, PassResult, transform
from mlsys_jax.passes.rewrite.level import Emit, Level
from mlsys_jax.passes.feature_cut import Site
from mlsys_jax.passes.validate import Region, check, enabled

# A rule's kind picks the fuzzer's oracle tier: structural rewrites compute bit-for-bit the same
# values, numeric ones may round differently.
STRUCTURAL, NUMERIC = "structural", "numeric"
# How a caveat begins when the rewrite is exact only on finite inputs (the oracles then judge it on
# a program's finite inputs).
FINITE_ONLY = "exact for finite inputs"


@dataclass(frozen=True)
class Precondition:
    """A named precondition: ``test(match, level)`` returns None when it holds, else the reason."""

    name: str
    test: Callable


@dataclass(frozen=True)
class Refused:
    """An anchor that matched, refused while the pattern was followed (equation ``anchor``)."""

    anchor: int
    check: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Match:
    """One rewrite a rule would make at a level: the equation it is named by, the equations it
    replaces (its region), the values it replaces, and what it does (the log line). Rules add
    their own fields in subclasses."""

    anchor: int
    eqns: tuple
    outputs: tuple
    detail: str


@dataclass(frozen=True)
class Rule:
    """A rewrite rule and its registry entry (see the module doc)."""

    name: str
    what: str
    match: Callable[..., Iterable]
    emit: Callable
    checks: tuple = ()
    kind: str = NUMERIC
    search_move: bool = True
    caveat: str = ""
    primitives: frozenset = frozenset()   # a program without any of these cannot match
    # the fuzzer's side, beside the rule: ``motif(g)`` adds to a program being generated (``g``,
    # a fuzz ``Builder``) a pattern this rule fires on, drawn ``motif_weight`` times as often as
    # a plain motif in programs of ``motif_layouts``; ``mutants`` are broken variants
    # (``rewrite.mutate.RuleMutant``) the fuzzer's oracles must catch
    motif: Callable | None = None
    motif_layouts: tuple = ("nchw", "nhwc")
    motif_weight: int = 1
    mutants: tuple = ()
    order: int = 100                      # its place among the registered passes, then its name

    # -- analysis ----------------------------------------------------------------------------
    def checked(self, level: Level, log: Log, **options) -> list:
        """The matches at ``level`` whose checks hold, in order; refusals logged."""
        out = []
        for item in self.match(level, **options):
            if isinstance(item, Refused):
                log.refused(level.where(item.anchor), item.reason, check=item.check)
                continue
            why = next(((c.name, r) for c in self.checks if (r := c.test(item, level))), None)
            if why is None:
                why = _placement(level, item)[1]
            if why is not None:
                log.refused(level.where(item.anchor), why[1], check=why[0])
                continue
            out.append(item)
        return out

    def region(self, level: Level, m: Match) -> Region:
        """The equations ``m`` replaces as a function of what they read (``passes/validate``),
        with the constant subgraphs they read, back to the program's constants: validation
        recomputes those itself rather than trust the rule's constant analysis."""
        main = sorted(m.eqns)
        made = {v for i in main for v in level.eqns[i].outvars}
        inputs, consts, sub = [], {}, set()
        stack = []
        for i in main:
            for v in level.eqns[i].invars:
                if type(v) is Literal or v in made or v in inputs:
                    continue
                (stack if level.value(v) is not None else inputs).append(v)
        seen = set()
        while stack:  # back through the equations that compute the constants read
            v = stack.pop()
            if v in seen:
                continue
            seen.add(v)
            i = level.defined.get(v)
            producer = level.eqns[i] if i is not None else None
            if producer is None or not all(type(x) is Literal or level.value(x) is not None
                                           for x in producer.invars):
                consts[v] = level.value(v)  # a constant of the program (or of the call)
                continue
            sub.add(i)
            stack += [x for x in producer.invars if type(x) is not Literal]
        eqns = [level.eqns[i] for i in sorted(sub | set(main))]
        removed = frozenset(id(level.eqns[i]) for i in main)
        s = getattr(m, "site", None)  # a fold's linear site: validation may cut its features
        site = None if s is None else Site(s.w, s.weight_axes, s.feature_shape, s.cuttable, s.b,
                                           s.x)
        return Region(tuple(eqns), tuple(inputs), consts, tuple(m.outputs), removed, site)

    def replacement(self, level: Level, m: Match, memo: dict | None = None) -> Callable:
        """``m``'s emit as a function of the region's inputs (what ``validate`` runs), on a cut
        of the site's output features when given one. ``memo``: what the emit computes from
        constants alone, once per precision and cut (``Emit.once``); the rewrite that shares it
        ships the very constants validated."""
        memo = {} if memo is None else memo

        def run(read, widen, cut=None):
            return self.emit(m, Emit(level, read, widen, concrete=True, cut=cut, memo=memo))
        return run

    # -- the pass ----------------------------------------------------------------------------
    def make_pass(self, only: int | None = None, **options) -> Pass:
        def make_rule(closed, log, path):
            if only is not None and path:
                return None
            level = Level(closed, path=path)
            matches = self.checked(level, log, **options)
            if only is not None:
                matches = matches[only:only + 1]
            at = {}
            for m in matches:
                scope, memo = None, {}  # validated whole, or on the features named
                if enabled():
                    why, scope = check(self.region(level, m), self.replacement(level, m, memo))
                    if why is not None:
                        log.refused(level.where(m.anchor), f"translation validation: {why}",
                                    check="translation_validation")
                        continue
                at[_placement(level, m)[0]] = (m, scope, Emit.shipped(memo))
            if not at:
                return None

            def rule(i, eqn, invals, lookup, here):
                if i not in at:
                    return None
                m, scope, memo = at[i]
                outs = self.emit(m, Emit(level, lookup, memo=memo))
                log.fired(level.where(m.anchor), m.detail if scope is None else
                          f"{m.detail} (translation validation on {scope})")
                return outs
            return rule

        def fn(closed):
            log = Log(self.name)
            if self.primitives and not any(e.primitive.name in self.primitives
                                           for e in equations(closed)):
                return PassResult(closed, False)  # nothing to match: skip the walk
            new = transform(closed, make_rule, log, recurse=only is None)
            if new is not closed:
                new = dce_jaxpr(new)
            return PassResult(new, new is not closed, tuple(log.rewrites), tuple(log.refusals))
        return Pass(self.name if only is None else f"{self.name}@{only}", fn)

    # -- the search's view ---------------------------------------------------------------------
    def candidates(self, closed, **options) -> int:
        """How many top-level rewrites the rule could apply to ``closed`` (its search moves)."""
        with jax.ensure_compile_time_eval():
            return len(self.checked(Level(closed), Log("count"), **options))

    def refusals(self, closed, **options) -> tuple:
        """What the rule refuses in ``closed`` (every level), without rewriting anything."""
        log = Log(self.name)
        with jax.ensure_compile_time_eval():
            for jaxpr, consts, path in levels(closed.jaxpr, closed.consts):
                self.checked(Level(jaxpr, consts, path), log, **options)
        return tuple(log.refusals)


def _placement(level: Level, m: Match) -> tuple:
    """(index of the region equation whose place the replacement takes, None) — the first at
    which every input of the region exists, if that is before anything outside the region reads
    an output — else (None, (check, reason))."""
    mine = set(m.eqns)
    ready = -1
    for i in mine:
        for v in level.eqns[i].invars:
            if type(v) is not Literal and level.defined.get(v, -1) not in mine \
                    and level.value(v) is None:
                ready = max(ready, level.defined.get(v, -1))
    first_read = min((u for o in m.outputs for u in level.users.get(o, []) if u >= 0
                      and u not in mine), default=len(level.eqns))
    at = [i for i in sorted(mine) if i > ready]
    if not at or at[0] >= first_read:
        return None, ("inputs_before_outputs", "an input of the rewrite is computed after one of "
                      "its outputs is used; the rewrite has no place in the program")
    return at[0], None


def levels(jaxpr, consts=(), path: str = ""):
    """``(jaxpr, consts, path prefix)`` of an open jaxpr and of every body nested in it (paths as
    ``ir.walk`` names them), for analyses that do not rewrite."""
    yield jaxpr, tuple(consts), path
    for i, e in enumerate(jaxpr.eqns):
        for b in bodies(e):
            yield from levels(b.jaxpr, b.consts, body_path(f"{path}{i}", b))
