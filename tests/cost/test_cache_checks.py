"""Measured figures on disk are keyed by the machine and checked when read: another CPU's
calibration is never used, and a corrupt or hand-edited file (negative, zero, NaN or missing
figures, broken JSON) is said in one line and measured again, never used."""
import json

import pytest

from mlsys_jax.cost import cache, hardware
from mlsys_jax.cost.here.operators import OperatorModel


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    calls = []

    def fake_calibration():
        calls.append(1)
        return hardware.Hardware("cpu", {"f32": 1e11, "f64": 5e10}, 1e10, 5e-6, "measured")
    monkeypatch.setattr(hardware, "calibrate_device", fake_calibration)
    return tmp_path, calls


def _write(path, ident, entries):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"identity": ident, "entries": entries}))


def test_the_cpu_calibration_is_keyed_by_the_cpu_model_and_core_count(home):
    _, calls = home
    hardware.cpu_hardware()
    stored = json.loads(hardware._cache_path().read_text())["identity"]
    assert stored["cpu"] == cache.cpu_name() and stored["cores"] and stored["jaxlib"]
    hardware.cpu_hardware()
    assert len(calls) == 1                  # the second call reads the cache


GOOD = {"name": "cpu", "peak_flops": {"f32": 1e11}, "bandwidth": 1e10, "launch_s": 5e-6}


@pytest.mark.parametrize("hw", [
    {**GOOD, "bandwidth": -1e10}, {**GOOD, "bandwidth": 0.0}, {**GOOD, "bandwidth": float("nan")},
    {**GOOD, "bandwidth": "fast"}, {**GOOD, "launch_s": float("inf")},
    {**GOOD, "peak_flops": {"f32": -1}}, {**GOOD, "peak_flops": [1e11]}, {**GOOD, "extra": 1},
    [1, 2], "hw"])
def test_a_bad_cached_cpu_figure_is_said_and_measured_again(home, capsys, hw):
    _, calls = home
    ident = {**cache.identity(), "calibration": hardware.CALIBRATION_VERSION}
    _write(hardware._cache_path(), ident, {"hw": hw})
    got = hardware.cpu_hardware()
    assert calls == [1] and got.bandwidth == 1e10
    assert "calibration" in capsys.readouterr().err


def test_another_machines_calibration_is_not_used(home):
    _, calls = home
    other = {**cache.identity(), "calibration": hardware.CALIBRATION_VERSION, "cpu": "Other CPU"}
    hw = {"name": "cpu", "peak_flops": {"f32": 9e15}, "bandwidth": 9e15, "launch_s": 1e-9}
    _write(hardware._cache_path(), other, {"hw": hw})
    assert hardware.cpu_hardware().bandwidth == 1e10 and calls == [1]


def test_broken_json_is_said_in_one_line(tmp_path, capsys):
    path = tmp_path / "x.json"
    path.write_text("{not json")
    assert cache.load(path, {"a": 1}) == {}
    err = capsys.readouterr().err
    assert err.startswith("mlsys-jax: note: the cache file") and err.count("\n") == 1


def test_operator_entries_that_are_not_real_times_are_dropped(tmp_path, capsys):
    path = tmp_path / "ops.json"
    ident = cache.identity()
    _write(path, ident, {"kernel:a": {"us": -2e6}, "kernel:b": {"us": float("nan")},
                         "kernel:c": {"us": 12.5},
                         "dispatch": {"call_us": 0.0, "per_input_us": 1, "per_output_us": 1,
                                      "per_kernel_us": 1}})
    model = OperatorModel(path=path, progress=False)
    assert set(model.entries) == {"kernel:c"}
    assert "3 entries" in capsys.readouterr().err


def test_the_cache_key_names_the_cpus_instruction_set():
    ident = cache.identity()
    assert {"cpu", "cpu_flags", "cores", "jax", "jaxlib", "platform"} <= set(ident)
    with open("/proc/cpuinfo") as f:
        listed = any(line.startswith(("flags", "Features")) for line in f)
    assert bool(ident["cpu_flags"]) == listed
