"""The passes by name: the one list that the CLI, the search, the fuzzer and its oracles read.

Each entry is a factory (options as keyword arguments) with what the rest of the project needs to
know about it: its *kind* — ``structural`` (the rewritten program computes bit-for-bit the same
values: the fuzzer's bitwise tier) or ``numeric`` (constants are recomputed, so values may round
differently: the error-ratio tier) — and whether the TASO-style search may use it as a move (it
then takes ``only=k`` to apply one site at a time, lecture §4.4). Names are parsed and checked
here, with one error message for an unknown name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from mlsys_jax.errors import MlsysError
from mlsys_jax.passes import basic, conv
from mlsys_jax.passes.core import Pass, chain

STRUCTURAL, NUMERIC = "structural", "numeric"


@dataclass(frozen=True)
class Entry:
    """One registered pass: its name (the name of the Pass its factory returns), factory, kind,
    whether the search may use it, and what it does."""

    name: str
    factory: Callable[..., Pass]
    kind: str
    search_move: bool
    what: str


PASSES: dict[str, Entry] = {e.name: e for e in (
    Entry("dce", basic.dce, STRUCTURAL, False, "remove equations no output needs (effects kept)"),
    Entry("cse", basic.cse, STRUCTURAL, False, "merge equal equations (primitive, inputs, params)"),
    Entry("fold_constants", basic.fold_constants, NUMERIC, False,
          "evaluate equations whose inputs are all constants"),
    Entry("inline", basic.inline, STRUCTURAL, False, "inline named calls into their parent"),
    Entry("fold_conv_bn", conv.fold_conv_bn, NUMERIC, True,
          "fold inference BatchNorm into the conv's weights and a bias (§4.1)"),
    Entry("merge_parallel_convs", conv.merge_parallel_convs, NUMERIC, True,
          "merge convs on the same input into one (§4.1)"),
    Entry("enlarge_conv_kernel", conv.enlarge_conv_kernel, NUMERIC, True,
          "zero-pad a kernel to a parallel conv's window (§4.2 step 3)"),
)}
NAMES = tuple(PASSES)
# The standard pipeline (``mlsys-jax optimize`` without --passes): fold constants first so the
# conv rules see constant BN statistics, merge duplicates, then the §4.1 rules, then clean up.
DEFAULT_PIPELINE = ("fold_constants", "cse", "fold_conv_bn", "merge_parallel_convs", "dce")
SEARCH_MOVES = tuple(n for n, e in PASSES.items() if e.search_move)


def names(spec: str | Iterable[str] | None = None, *, default: Iterable[str] = NAMES,
          choices: Iterable[str] = NAMES, source: str = "passes") -> tuple[str, ...]:
    """Pass names from ``'dce,cse'`` or a list (None: ``default``), each checked against
    ``choices``; ``source`` (e.g. ``--passes``) begins the error message."""
    choices = tuple(choices)
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
    """``{name: factory}`` of the search's moves (None: all of :data:`SEARCH_MOVES`)."""
    chosen = names(spec, default=SEARCH_MOVES, choices=SEARCH_MOVES, source=source)
    return {n: PASSES[n].factory for n in chosen}
