"""Experiment 03: the lecture's remat counts, bitwise gradients, optimal vs every-K, Revolve."""
import pytest

import experiments.s03_remat as s03
from mlsys_jax.errors import MlsysError
from tests.experiments.terminal import assert_fits_a_terminal


def _by_name(rows):
    return {r["schedule"].split(" ")[0]: r for r in rows}


def test_default_chain_counts_without_jax():
    # N = 64, reference executor only (the JAX half is tested on a short chain below)
    result = s03.run(jax=False, milp_budgets=0)
    checks = s03.check(result)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    rows = _by_name(result.tables["schedules"])
    assert (rows["store-all"]["stored"], rows["store-all"]["forwards"]) == (65, 64)
    assert (rows["every-8"]["stored"], rows["every-8"]["extra"]) == (16, 56)
    assert (rows["input-only"]["stored"], rows["input-only"]["forwards"]) == (3, 2144)
    ex5 = _by_name(result.tables["exercise_5"])
    assert (ex5["store-all"]["stored"], ex5["every-10"]["stored"]) == (101, 20)
    assert (ex5["store-all"]["forwards"], ex5["every-10"]["forwards"]) == (100, 190)
    rev = {r["slots"]: r for r in result.tables["revolve"]}
    assert rev[8]["revolve_closed_form_advances"] == rev[8]["dp_revolve_convention_advances"] == 137
    assert rev[16]["dp_revolve_convention_advances"] == 110
    assert len(checks) >= 11
    assert_fits_a_terminal(result, checks)


@pytest.mark.slow
def test_short_chain_with_jax():
    result = s03.run(n_layers=16, ks=(1, 2, 4, 16), jax_input_only_layers=3, batch=64,
                     revolve_slots=(2, 4), milp_budgets=2)
    checks = s03.check(result)
    assert all(c.ok for c in checks), [c for c in checks if not c.ok]
    rows = _by_name(result.tables["schedules"])
    assert rows["every-4"]["jax_forwards"] == 32         # JAX convention: N extra
    assert rows["every-4"]["forwards"] == 28             # lecture convention: (K-1)·N/K extra
    assert rows["every-4"]["xla_temp_bytes"] < rows["store-all"]["xla_temp_bytes"]
    assert rows["store-all"]["jax_vs_numpy_max_abs"] < 1e-12
    assert any("PyTorch" in n for n in result.notes)
    assert_fits_a_terminal(result, checks)
    milp = result.tables["milp"]
    assert len(milp) == 2 and milp[0]["planned_saved"] == 0 and milp[-1]["recompute_flops"] == 0


def test_bad_settings():
    with pytest.raises(MlsysError, match="1 <= K <= n_layers=8"):
        s03.run(n_layers=8, ks=(0, 4))
    with pytest.raises(MlsysError, match="positive int"):
        s03.run(n_layers=0)
