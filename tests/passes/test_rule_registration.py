"""Every rewrite rule is one module of passes/rules/ and nothing else: found and registered,
exported from ``mlsys_jax.passes``, with a motif the fuzzer draws and mutants it hunts. That the
motif makes the rule fire is the campaign tier's check (tests/fuzz/test_campaign.py: every pass
fires on at least a tenth of its programs), and that each mutant is caught the mutation score's
(tests/fuzz/test_mutants.py)."""
import pytest

from mlsys_jax import passes
from mlsys_jax.fuzz.mutants import MUTANTS
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
