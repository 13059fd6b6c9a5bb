"""Experiment 05 (seed 003): every claim holds on small settings, and the exact figures are right."""
import jax
import pytest

from experiments import s05_dispatch_fusion as s05
from experiments.s05_dispatch_fusion.fusion import hlo_kernels
from mlsys_jax.errors import MlsysError
from tests.experiments.terminal import assert_fits_a_terminal

SMALL = dict(sizes=(10, 1_000_000), chain_ns=(1, 50), chain_size=100, fusion_size=1_000_000,
             conv_shape=(2, 16, 16, 8), batch=32, repeats=7)


@pytest.fixture(scope="module")
def result():
    return s05.run(**SMALL)


# A claim that rests on a measured time is asserted here only if every run we measured at these
# settings (11 runs on the shared 2-core machine, load average 3 to 13) cleared its threshold by
# 2× or more: dispatch share on the largest tensor 0.008–0.07 (claim < 0.5), chain slopes
# 21–236× (≥ 5×), unfused/fused 5.8–9.7× (≥ 1.5×), eager dispatch 2.5–15× the jitted call's
# (claim: less), measured eager/jit step 3.0–5.4× (> 1). One claim did not clear it; it stays a
# claim of `mlsys-jax run 05`, and `mlsys-jax bench dispatch` measures it side by side:
NOT_ASSERTED = {"small inputs: eager per op ≥ 3× jit per op (dispatch-bound)":
                "17–20× on a quiet machine, 4.3× at load average 13 (1.4× its threshold)"}


@pytest.mark.slow
def test_every_claim_holds(result):
    checks = s05.check(result)
    assert set(NOT_ASSERTED) <= {c.claim for c in checks}  # left out by name, never by accident
    failed = [c for c in checks if not c.ok and c.claim not in NOT_ASSERTED]
    assert failed == []


def test_fusion_kernels_ops_and_bytes_are_exact(result):
    ew, conv = result.tables["fusion"]
    n = SMALL["fusion_size"]
    assert (ew["ops"], ew["op_names"]) == (4, "mul add relu mul")
    assert ew["hlo_kernels"] == 1 and ew["hlo_opcodes"] == "fusion×1"
    # Unfused: 4 kernels each read and write n float32; fused: one read, one write.
    assert (ew["bytes_unfused"], ew["bytes_fused"]) == (4 * 2 * 4 * n, 2 * 4 * n)
    b, h, w, c = SMALL["conv_shape"]
    e, weights = 4 * b * h * w * c, 4 * 9 * c * c
    assert (conv["ops"], conv["op_names"]) == (3, "conv add relu")
    assert conv["bytes_unfused"] == 6 * e + weights + 4 * c
    assert conv["bytes_fused"] == 4 * e + weights + 4 * c
    if jax.devices()[0].platform == "cpu":
        assert conv["hlo_opcodes"] == "convolution×1 fusion×1"


def test_breakdown_has_both_modes_beside_the_seed(result):
    eager, opt = result.tables["breakdown"]
    assert (eager["mode"], opt["mode"]) == ("eager", "optimized")
    assert (eager["kernels"], opt["kernels"]) == (6, 4)  # lecture §8.1: 6 → 4 kernels
    assert eager["compute_us"] == pytest.approx(opt["compute_us"])  # fusion saves no FLOPs
    assert eager["seed_compute/memory/dispatch"] == "40/50/30"


def test_reports_the_device_measured(result):
    dev = result.data["device"]
    assert dev["platform"] == jax.devices()[0].platform
    assert any(dev["device_kind"] in n for n in result.notes)


def test_hlo_kernel_count_reads_the_entry_computation():
    text = """HloModule m
%fused (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %m = f32[4]{0} multiply(%p, %p)
}

ENTRY %main (x: f32[4], w: f32[3,3]) -> (f32[4], f32[4]) {
  %x = f32[4]{0} parameter(0)
  %c = f32[] constant(1)
  %f = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
  %d = f32[4]{0} convolution(%f, %f), window={size=1}
  ROOT %t = (f32[4]{0}, f32[4]{0}) tuple(%f, %d)
}
"""
    assert dict(hlo_kernels(text)) == {"fusion": 1, "convolution": 1}


def test_plots_written_or_skipped_with_reason(tmp_path, monkeypatch, result):
    from mlsys_jax.viz import plots

    paths = s05.plots(result, str(tmp_path))
    if plots.unavailable_reason() is None:
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == ["05_breakdown.png", "05_chain.png", "05_dispatch_vs_size.png"]
        assert sorted(paths) == sorted(str(tmp_path / n) for n in names)
        assert all((tmp_path / n).stat().st_size > 1000 for n in names)
        assert plots.plot_notes(paths) == [f"plot written: {p}" for p in paths]
    monkeypatch.setattr(plots, "unavailable_reason", lambda: "plots skipped: no matplotlib")
    assert s05.plots(result, str(tmp_path / "none")) == []
    assert plots.plot_notes([]) == ["plots skipped: no matplotlib"]


@pytest.mark.parametrize("bad", [dict(sizes=(100, 10)), dict(sizes=(10,)), dict(chain_ns=(0, 5)),
                                 dict(conv_shape=(1, 2, 3)), dict(repeats=0)])
def test_bad_settings_are_clear_errors(bad):
    with pytest.raises(MlsysError, match="experiment 05"):
        s05.run(**bad)


def test_printed_report_fits_a_terminal(result):
    assert_fits_a_terminal(result, s05.check(result))
