"""Experiment 04: every lecture claim holds on computed data, with the figures pinned down."""
import json
import subprocess
import sys

import pytest

from experiments import s04_parallel as s04
from mlsys_jax import cli
from mlsys_jax.errors import MlsysError
from mlsys_jax.results import OverrideError, Result
from tests.experiments.terminal import assert_fits_a_terminal


@pytest.fixture(scope="module")
def result():
    return s04.run()


@pytest.mark.slow
def test_every_check_passes(result):
    checks = s04.check(result)
    assert len(checks) >= 12
    assert [c.claim for c in checks if not c.ok] == []


def test_data_parallel_figures(result):
    rows = result.tables["demo 1: data parallel (§5.1)"]
    even, naive, weighted, twice = rows
    assert even["worst_diff"] < 1e-12 and weighted["worst_diff"] < 1e-12
    assert naive["grad_diff"] > 0.01                         # lecture: 0.17
    assert twice["grad_ratio"] == pytest.approx(4.0)         # psum of a summed grad: N x
    assert naive["lecture"] == 0.17 and even["lecture"] == 5.6e-17


def test_tensor_parallel_figures(result):
    rows = {r["split"]: r for r in result.tables["demo 2: tensor parallel (§5.2)"]}
    meg = rows["Megatron MLP (column → row)"]
    assert meg["hlo_collectives"] == "all-reduce×1" and meg["max_diff"] < 1e-12
    assert rows["wrong split (row first, relu before sum)"]["max_diff"] > 0.1
    assert rows["sequence parallel MLP"]["hlo_collectives"] == "all-gather×1, reduce-scatter×1"
    assert result.tables["TP training step"][0]["worst_diff"] < 1e-12


def test_zero_bytes_and_communication(result):
    rows = result.tables["ZeRO per-device bytes (§7.3)"]
    assert [r["layout"] for r in rows] == ["DP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    for r in rows:
        assert r["args_measured"] == r["args_formula"]
        assert r["outputs_measured"] == r["outputs_formula"]
    psi = rows[0]["params"]                                  # Ψ·8 bytes; 4 devices
    assert [r["model_state"] for r in rows] == [4 * psi, 2 * psi + psi // 2, psi + 3 * psi // 4,
                                                psi]
    comm = {r["layout"]: r for r in result.tables["communication per step (HLO vs ring formula)"]}
    assert all(r["match"] for r in comm.values())
    assert comm["ZeRO-2"]["bytes_measured"] == pytest.approx(comm["DP"]["bytes_measured"])
    assert comm["ZeRO-1"]["bytes_measured"] > comm["DP"]["bytes_measured"]


def test_every_claim_is_derived_from_the_result(result):
    # check() reads the result only: a copy gives the same claims, and a table edited to be
    # wrong turns exactly its claims false.
    tables = {k: [dict(r) for r in rows] for k, rows in result.tables.items()}
    copy = Result(result.id, result.title, tables, [], result.data)
    assert [c.claim for c in s04.check(copy)] == [c.claim for c in s04.check(result)]
    tables["pipeline bubble"][0]["exact"] = False
    tables["demo 1: data parallel (§5.1)"][0]["worst_diff"] = 1.0
    failed = [c.claim for c in s04.check(copy) if not c.ok]
    assert len(failed) == 2 and failed[0].startswith("DP on 4 devices")
    assert "bubble counted on every schedule table" in failed[1]


def test_pipeline_and_3d_sections_are_in_the_result(result):
    assert "pipeline bubble" in result.tables and "3D step vs single device" in result.tables


@pytest.mark.slow
def test_pipeline_picture_drawn_from_the_result(result, tmp_path):
    from mlsys_jax.viz import plots

    paths = s04.plots(result, str(tmp_path))
    if plots.unavailable_reason() is None:
        assert paths == [str(tmp_path / "04_pipeline_timeline.png")]
        assert (tmp_path / "04_pipeline_timeline.png").stat().st_size > 10_000
    else:
        assert paths == []
    data_only = s04.run(sections=("data",))
    assert s04.plots(data_only, str(tmp_path / "none")) == []  # no schedules, no picture


@pytest.mark.slow
def test_pipeline_overrides_and_section_choice():
    res = s04.run(pp_stages=4, microbatches=8, sections=("pipeline",))
    assert "demo 1: data parallel (§5.1)" not in res.tables
    checks = s04.check(res)
    assert checks and all(c.ok for c in checks)


def test_layouts_that_do_not_fit_are_skipped_with_a_note():
    res = s04.run(dp_devices=16, uneven=(2,) * 16, sections=("data",))
    assert res.tables == {} or "demo 1: data parallel (§5.1)" not in res.tables
    assert any("needs 16 devices but only 8" in n for n in res.notes)


def test_bad_settings():
    with pytest.raises(OverrideError, match="unknown setting"):
        s04.run(devices=3)
    with pytest.raises(MlsysError, match="unknown section"):
        s04.run(sections=("data", "expert"))
    with pytest.raises(MlsysError, match="must have dp_devices=4 counts"):
        s04.run(uneven=(10, 10, 12), sections=("data",))
    with pytest.raises(MlsysError):
        s04.run(pp_stages=2, microbatches=0, sections=("pipeline",))


def test_cli_processes_errors(capsys):
    assert cli.main(["run", "04", "--processes", "3"]) == 2
    assert "split evenly" in capsys.readouterr().err


@pytest.mark.slow
def test_run_04_processes_2_in_a_fresh_process_equals_one_process():
    """`mlsys-jax run 04 --processes 2 --json` in a fresh process (the CLI's own precision set-up,
    not this suite's float64): 2 workers × 4 CPU devices against the CLI's own 8, exit 0, one
    JSON object, every rank agreeing and the one check passed; ``--set batch=16`` reaches the
    run. One launch for all of it: each launch starts two workers that import JAX."""
    done = subprocess.run([sys.executable, "-m", "mlsys_jax.cli", "run", "04", "--processes", "2",
                           "--set", "batch=16", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    got = json.loads(done.stdout)
    row = got["tables"]["multi-process DP vs one process"][0]
    assert row["layout"] == "2 processes × 4 CPU devices (gloo)" and row["ranks_agree"]
    assert row["devices"] == 8 and any("batch 16, float64" in n for n in got["notes"])
    assert [c["ok"] for c in got["checks"]] == [True]


def test_printed_report_fits_a_terminal(result):
    assert_fits_a_terminal(result, s04.check(result))
