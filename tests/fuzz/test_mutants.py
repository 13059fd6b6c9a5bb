"""Mutation score (docs/verification.md §4): every deliberately broken pass is caught within 300 programs."""
import pytest

from mlsys_jax.fuzz.mutants import MUTANTS, hunt

LIMIT = 300


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_caught(mutant):
    row = hunt(mutant, seed=0, limit=LIMIT)
    assert row["caught"], f"{mutant.name} ({mutant.what}) survived {LIMIT} programs"
    assert row["programs"] <= LIMIT


def test_at_least_the_seven_mutants_of_testing_md():
    names = {m.name for m in MUTANTS}
    assert {"cse_ignores_params", "dce_drops_effects", "fold_clears_weak_type",
            "conv_bn_wrong_channel_axis", "conv_bn_no_eps", "merge_concat_wrong_axis",
            "dp_double_psum"} <= names
