"""The passes by name: the one list that the CLI, the search, the fuzzer and its oracles read.

Each entry is a factory (options as keyword arguments) with what the rest of the project needs to
know about it: its *kind* — ``structural`` (the rewritten program computes bit-for-bit the same
values: the fuzzer's bitwise tier) or ``numeric`` (constants are recomputed, so values may round
differently: the error-ratio tier) — and whether the TASO-style search may use it as a move (it
then takes ``only=k`` to apply one site at a time, lecture §4.4). Names are parsed and checked
here, with one error message for an unknown name.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable

from mlsys_jax.errors import MlsysError
from mlsys_jax.passes import basic
from mlsys_jax.passes.core import Pass, chain
from mlsys_jax.passes import rules
from mlsys_jax.passes.rewrite.rule import FINITE_ONLY, NUMERIC, STRUCTURAL, Rule

__all__ = ["Entry", "PASSES", "NAMES", "DEFAULT_PIPELINE", "STRUCTURAL", "NUMERIC", "FINITE_ONLY",
           "names",
           "entry", "make", "kind", "name_of", "pipeline", "instantiate", "search_moves",
           "register", "registered", "rule_entry"]


@dataclass(frozen=True)
class Entry:
    """One registered pass: its name (the name of the Pass its factory returns), factory, kind,
    whether the search may use it, what it does, its exactness caveat ("" when exact), and the
    :class:`~mlsys_jax.passes.rewrite.rule.Rule` it is made from (None for a plain pass)."""

    name: str
    factory: Callable[..., Pass]
    kind: str
    search_move: bool
    what: str
    caveat: str = ""
    rule: Rule | None = None

    # the search's view of a move (passes/search.py)
    def candidates(self, closed) -> int:
        """How many separate rewrites the move offers on ``closed`` (a plain pass: one)."""
        return self.rule.candidates(closed) if self.rule is not None else 1

    def move(self, k: int) -> Pass:
        """The pass applying rewrite ``k`` of :meth:`candidates` alone."""
        return self.factory(only=k) if self.rule is not None else self.factory()

    def refusals(self, closed) -> tuple:
        """What the move still refuses in ``closed``, without rewriting it."""
        return self.rule.refusals(closed) if self.rule is not None else ()


def rule_entry(module) -> Entry:
    """The entry of a rule module: its ``RULE`` and the factory named like it."""
    r = module.RULE
    return Entry(r.name, getattr(module, r.name), r.kind, r.search_move, r.what, r.caveat, r)


PASSES: dict[str, Entry] = {e.name: e for e in (
    Entry("dce", basic.dce, STRUCTURAL, False, "remove equations no output needs (effects kept)"),
    Entry("cse", basic.cse, STRUCTURAL, False, "merge equal equations (primitive, inputs, params)"),
    Entry("fold_constants", basic.fold_constants, NUMERIC, False,
          "evaluate equations whose inputs are all constants"),
    Entry("inline", basic.inline, STRUCTURAL, False, "inline named calls into their parent"),
    # every module of passes/rules/, found there: a new rule is a new module
    *(rule_entry(m) for m in sorted(rules.modules(), key=lambda m: m.RULE.order)),
)}
NAMES = tuple(PASSES)  # the built-in passes (``PASSES`` also holds any registered since)
# The standard pipeline (``mlsys-jax optimize`` without --passes): fold constants first so the
# rules see constant BN statistics, merge duplicates, then the §4.1 rules, then clean up.
DEFAULT_PIPELINE = ("fold_constants", "cse", "fold_conv_bn", "fold_dense_bn", "fold_matmul_scale",
                    "merge_parallel_convs", "dce")


def search_move_names() -> tuple:
    return tuple(n for n, e in PASSES.items() if e.search_move)


@contextmanager
def registered(entry_or_module):
    """``entry`` (or a rule module's entry) registered for the duration of a ``with`` block, as if
    listed above (tests; a project's own rules)."""
    e = entry_or_module if isinstance(entry_or_module, Entry) else rule_entry(entry_or_module)
    register(e)
    try:
        yield e
    finally:
        PASSES.pop(e.name, None)


def register(e: Entry) -> None:
    """Add a pass to the registry (its name must be new)."""
    if e.name in PASSES:
        raise MlsysError(f"passes.registry: a pass named {e.name!r} is registered already")
    PASSES[e.name] = e


def names(spec: str | Iterable[str] | None = None, *, default: Iterable[str] | None = None,
          choices: Iterable[str] | None = None, source: str = "passes") -> tuple[str, ...]:
    """Pass names from ``'dce,cse'`` or a list (None: ``default``, every registered pass unless
    given), each checked against ``choices`` (every registered pass unless given); ``source``
    (e.g. ``--passes``) begins the error message."""
    choices = tuple(PASSES) if choices is None else tuple(choices)
    default = choices if default is None else default
    if spec is None:
        return tuple(default)
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    got = tuple(str(s).strip() for s in parts if str(s).strip())
    if not got:
        raise MlsysError(f"{source} is empty; give a comma-separated list from "
                         f"{', '.join(choices)}")
    unknown = [n for n in got if n not in choices]
    if unknown:
        raise MlsysError(f"{source}: unknown pass(es) {', '.join(map(repr, unknown))}; choose "
                         f"from {', '.join(choices)}")
    return got


def entry(name: str) -> Entry:
    return PASSES[names([name], source="passes.registry")[0]]


def make(name: str, **options) -> Pass:
    """A new pass by name, with the factory's options (e.g. ``make('cse', param_blind=True)``)."""
    return entry(name).factory(**options)


def kind(name: str) -> str:
    """``structural`` or ``numeric`` (see the module doc)."""
    return entry(name).kind


def name_of(factory: Callable[..., Pass]) -> str:
    """The registered name of a pass factory (for code that holds the factory, not the name)."""
    hit = [n for n, e in PASSES.items() if e.factory is factory]
    if not hit:
        raise MlsysError(f"{getattr(factory, '__name__', factory)!r} is not a registered pass; "
                         f"register it in mlsys_jax/passes/registry.py")
    return hit[0]


def pipeline(spec: str | Iterable[str] | None = None, source: str = "passes") -> Pass:
    """A ``chain`` of the named passes (None: :data:`DEFAULT_PIPELINE`)."""
    return chain(*(make(n) for n in names(spec, default=DEFAULT_PIPELINE, source=source)))


def instantiate(spec: str | Iterable[str] | None = None, source: str = "passes") -> dict:
    """``{name: Pass}`` for the named passes (None: every registered pass), in order."""
    return {n: make(n) for n in names(spec, source=source)}


def search_moves(spec: str | Iterable[str] | None = None, source: str = "search") -> dict:
    """``{name: Entry}`` of the search's moves (None: every registered search move)."""
    moves = search_move_names()
    chosen = names(spec, default=moves, choices=moves, source=source)
    return {n: PASSES[n] for n in chosen}
