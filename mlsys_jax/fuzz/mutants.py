"""Deliberately broken passes (docs/verification.md §4) and the mutation score.

Each mutant wraps or alters the *real* pass at call time — an option it exposes, a module attribute
patched for the duration of one call, or a post-processing step — never by editing its source. The
score is the fraction of mutants that the same campaign (same generator, same oracles) catches, and
after how many programs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable


from mlsys_jax.fuzz.judge import check_program
from mlsys_jax.fuzz.spec import Knobs, generate_seeded, program_seed
from mlsys_jax.passes import basic, registry


# ---- the mutants -----------------------------------------------------------------------------

def cse_ignoring_params():
    from mlsys_jax.passes import cse

    return cse(param_blind=True)


def dce_dropping_effects():
    """DCE that also deletes effectful equations with no outputs (debug prints, callbacks)."""
    from mlsys_jax.ir import rebuild
    from mlsys_jax.passes import Pass, PassResult, dce

    real = dce()

    def fn(closed):
        r = real(closed)
        drop = lambda eqn, invals: [] if eqn.effects and not eqn.outvars else None  # noqa: E731
        new = rebuild(r.jaxpr, handler=drop)
        return PassResult(new, True, r.rewrites, r.refusals)
    return Pass(real.name, fn)


def folding_clearing_weak_type():
    from mlsys_jax.passes import fold_constants

    return fold_constants(keep_weak=False)


@dataclass(frozen=True)
class Mutant:
    """A broken variant: its name, the factory of the registered pass it replaces (None: the
    data-parallel step), how to build it, what it gets wrong, and the campaign's knobs for
    programs of the only kind it can differ on (None: the default mix)."""

    name: str
    breaks: Callable | None
    make: Callable | None
    what: str
    knobs: Knobs | None = None

    @property
    def target(self) -> str:
        """The registered name of the pass it breaks, or 'data_parallel'."""
        return "data_parallel" if self.breaks is None else registry.name_of(self.breaks)


def rule_mutants() -> tuple:
    """Every registered rule's mutants, declared beside the rule (``Rule.mutants``), hunted with
    their own knobs or else among programs of their rule's kind (:func:`of_its_rules_kind`)."""
    return tuple(Mutant(m.name, e.factory, m.make, m.what,
                        Knobs(**m.knobs) if m.knobs else of_its_rules_kind(e.rule))
                 for e in registry.PASSES.values() if e.rule is not None for m in e.rule.mutants)


def of_its_rules_kind(rule) -> Knobs:
    """Knobs drawing the layouts a rule's motif is drawn in (``Rule.motif_layouts``): dense
    programs for a dense-only rule, images otherwise. A broken rule can differ only where its
    rule fires; the default mix draws those programs too, more rarely."""
    return Knobs(image=0.0 if set(rule.motif_layouts) == {"dense"} else 1.0)


MUTANTS = (
    Mutant("cse_ignores_params", basic.cse, cse_ignoring_params, "CSE keyed without params"),
    Mutant("dce_drops_effects", basic.dce, dce_dropping_effects, "DCE deleting debug callbacks"),
    Mutant("fold_clears_weak_type", basic.fold_constants, folding_clearing_weak_type,
           "constant folding that makes weak-typed results strong"),
    *rule_mutants(),
    Mutant("dp_double_psum", None, None,
           "data-parallel step that psums the already-summed gradient"),
)


def hunt(mutant: Mutant, seed: int = 0, limit: int = 300) -> dict:
    """Run the campaign's programs against one mutant until it is caught (or ``limit``)."""
    from mlsys_jax.fuzz.systems import dp_case

    t0 = time.perf_counter()
    broken = None if mutant.breaks is None else {mutant.target: mutant.make()}
    real = None if broken is None else registry.instantiate([mutant.target])
    for i in range(limit):
        pseed = program_seed(seed, i)
        if broken is None:
            fails = dp_case(pseed, "double_psum")
            if fails is None:
                return {"mutant": mutant.name, "target": mutant.target, "caught": False,
                        "programs": 0, "how": "skipped: needs at least 2 devices", "seconds": 0.0}
            message = fails[0] if fails else None
        else:
            spec = generate_seeded(pseed, mutant.knobs)
            # validation off: the oracles must catch the broken rule itself (translation
            # validation would refuse its rewrites; tests/passes/test_validate.py shows it does)
            out = check_program(spec, broken, pseed, gradients=False, validate=False)
            message = (f"{out.failures[0].kind}: {out.failures[0].message}"
                       if out.failures else None)
            # a catch counts only where the real pass is clean (else the real pass failed)
            if message and check_program(spec, real, pseed, gradients=False,
                                         validate=False).failures:
                message = None
        if message:
            return {"mutant": mutant.name, "target": mutant.target, "caught": True,
                    "programs": i + 1, "how": message[:200],
                    "seconds": round(time.perf_counter() - t0, 2)}
    return {"mutant": mutant.name, "target": mutant.target, "caught": False, "programs": limit,
            "how": None, "seconds": round(time.perf_counter() - t0, 2)}


def mutation_score(seed: int = 0, limit: int = 300, names=None) -> dict:
    """Hunt every mutant; the score is caught / total."""
    chosen = [m for m in MUTANTS if names is None or m.name in names]
    rows = [hunt(m, seed, limit) for m in chosen]
    caught = sum(r["caught"] for r in rows)
    return {"mutants": rows, "caught": caught, "total": len(rows),
            "score": caught / len(rows) if rows else 0.0, "seed": seed, "limit": limit}
