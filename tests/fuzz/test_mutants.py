"""Mutation score (docs/verification.md §4): every deliberately broken pass is caught within 300
programs (a rule's mutant hunted among programs of its rule's kind, ``fuzz.mutants``)."""
import pytest

from mlsys_jax.fuzz.mutants import MUTANTS, hunt

LIMIT = 300


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant):
    row = hunt(mutant, seed=0, limit=LIMIT)
    assert row["caught"], f"{mutant.name} ({mutant.what}) survived {LIMIT} programs"
    assert row["programs"] <= LIMIT


def test_rule_mutants_are_hunted_on_the_layouts_their_rule_rewrites():
    kinds = {m.name: m.knobs for m in MUTANTS}
    assert kinds["dense_bn_scales_rows"].image == 0.0 and kinds["conv_bn_no_eps"].image == 1.0
    assert kinds["cse_ignores_params"] is None and kinds["dp_double_psum"] is None
    assert kinds["conv_bn_folds_int_div"].integer == 1.0
    assert kinds["conv_bias_ignores_the_axis"].square == 1.0


def test_at_least_the_seven_mutants_of_testing_md():
    names = {m.name for m in MUTANTS}
    assert {"cse_ignores_params", "dce_drops_effects", "fold_clears_weak_type",
            "conv_bn_wrong_channel_axis", "conv_bn_no_eps", "merge_concat_wrong_axis",
            "dp_double_psum"} <= names
