"""Every rewrite rule is one module of passes/rules/ and nothing else: found and registered,
exported from ``mlsys_jax.passes``, drawn by the fuzzer (its motif makes it fire) and mutated
(its broken variants are hunted by the mutation score, tests/fuzz/test_mutants.py)."""
import pytest

from mlsys_jax import passes
from mlsys_jax.fuzz.campaign import CampaignOptions, run_campaign
from mlsys_jax.fuzz.mutants import MUTANTS
from mlsys_jax.fuzz.spec import Knobs
from mlsys_jax.passes import registry, rules

MODULES = rules.modules()
NAMES = [m.RULE.name for m in MODULES]


def test_every_rule_module_is_registered_and_exported():
    assert len(MODULES) >= 5
    for m in MODULES:
        entry = registry.PASSES[m.RULE.name]
        assert entry.rule is m.RULE and entry.factory is getattr(m, m.RULE.name)
        assert getattr(passes, m.RULE.name) is entry.factory and m.RULE.name in passes.__all__


@pytest.mark.parametrize("name", NAMES)
def test_every_rule_has_a_motif_and_a_mutant_beside_it(name):
    rule = registry.PASSES[name].rule
    assert callable(rule.motif) and rule.motif_layouts
    assert rule.mutants and {m.name for m in rule.mutants} <= {m.name for m in MUTANTS}
    assert all(m.target == name for m in MUTANTS if m.name in {r.name for r in rule.mutants})


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_the_fuzzer_makes_every_rule_fire(name):
    rule = registry.PASSES[name].rule
    image = 0.0 if rule.motif_layouts == ("dense",) else 1.0
    options = CampaignOptions(knobs=Knobs(image=image, integer=0.0), system_every=0,
                              gradient_every=0, fixpoint_every=0, shrink_failures=False)
    summary = run_campaign(12, 0, [name], options=options)
    assert summary.per_pass[name]["fired"] > 0, f"{name} never fired on 12 programs"
    assert not summary.failures
