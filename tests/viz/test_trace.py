"""``--trace OUT.json``: Chrome trace events (viz/trace.py) that satisfy the format's documented
fields; one track per stage and device for ``shard --mesh data=D,pipe=P``, counter tracks for
``remat``, consecutive kernels for ``inspect``; bad paths refused before any work."""
import json
from collections import Counter
from fractions import Fraction

import pytest

from mlsys_jax import cli
from mlsys_jax.parallel.schedules import one_f_one_b
from mlsys_jax.viz import trace
from tests.viz.models import check_trace, tracks, write


@pytest.fixture
def user_file(tmp_path):
    return write(tmp_path)


def _slices(doc) -> dict:
    """(pid, tid) -> its X events in time order."""
    out: dict = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            out.setdefault((e["pid"], e["tid"]), []).append(e)
    return {k: sorted(v, key=lambda e: e["ts"]) for k, v in out.items()}


def test_a_schedule_is_one_track_per_stage_and_replica():
    sched = one_f_one_b(3, 4)
    cells = [[None if a is None else str(a) for a in row] for row in sched.table]
    doc = trace.document(trace.pipeline_events(cells, devices=[[0, 1, 2], [3, 4, 5]],
                                               stage_us=[1.0, 2.0, 3.0]))
    check_trace(doc)
    assert trace.problems(doc) == []
    names = tracks(doc)
    assert sorted(names) == [(p, t) for p in (1, 2) for t in (1, 2, 3)]
    assert names[(2, 3)] == "stage 3 (device 5)"
    slices = _slices(doc)
    idle = 0
    for (pid, tid), events in slices.items():
        assert [e["ts"] for e in events] == [t * trace.UNIT_US for t in range(sched.steps)]
        kinds = Counter(e["cat"] for e in events)
        assert kinds["forward"] == kinds["backward"] == sched.microbatches
        idle += kinds["bubble"]
        assert all("not measured" in e["args"]["time"] for e in events)
        assert events[0]["args"]["device"] == [[0, 1, 2], [3, 4, 5]][pid - 1][tid - 1]
    assert Fraction(idle, 2 * sched.steps * sched.stages) == sched.bubble_fraction()


def test_memory_timelines_are_counter_tracks():
    series = {"no remat": ([0, 1, 2, 4], [0.0, 10.0, 20.0, 0.0]),
              "the plan": ([0, 1, 3, 4], [0.0, 5.0, 15.0, 0.0])}
    doc = trace.document(trace.memory_events(series))
    check_trace(doc)
    for label, (xs, ys) in series.items():
        got = [(e["ts"], e["args"]["bytes"]) for e in doc["traceEvents"]
               if e["ph"] == "C" and e["name"] == label]
        assert got == [(x * trace.UNIT_US, y) for x, y in zip(xs, ys)]
    halves = [(e["name"], e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X"]
    assert halves == [("forward", 0, 2 * trace.UNIT_US),
                      ("backward", 2 * trace.UNIT_US, 2 * trace.UNIT_US)]


def test_kernels_follow_one_another_and_the_measured_whole_beside_them():
    rows = [{"name": "matmul", "module": "net/mlp", "time_us": 2.5, "time": "estimated"},
            {"name": "relu", "module": "", "time_us": 1.0, "time": "estimated"}]
    doc = trace.document(trace.kernel_events(rows, track="kernels", measured_us=7.0,
                                             measured_what="measured"))
    check_trace(doc)
    first, second = _slices(doc)[(1, 1)]
    assert (first["name"], first["ts"], first["dur"]) == ("matmul [net/mlp]", 0.0, 2.5)
    assert (second["name"], second["ts"], second["dur"]) == ("relu", 2.5, 1.0)
    [whole] = _slices(doc)[(1, 2)]
    assert whole["dur"] == 7.0 and whole["args"]["kernels' sum (µs)"] == 3.5


def test_events_the_format_does_not_allow_are_not_written(tmp_path):
    assert trace.problems({"traceEvents": [{"ph": "C", "name": "x", "ts": 0, "pid": 1,
                                            "args": {"bytes": "many"}}]}) == [
        "event 0 (C 'x'): a counter's args must be numbers"]
    assert trace.problems({"events": []}) == ["no 'traceEvents' list"]
    with pytest.raises(AssertionError, match="no 'ts', 'dur', 'pid', 'tid'"):
        trace.write(str(tmp_path / "t.json"), [{"ph": "X", "name": "a"}])
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("argv, message", [
    (["inspect", "{f}:make", "--trace", "/no/such/dir/t.json"],
     "--trace '/no/such/dir/t.json': folder '/no/such/dir' does not exist"),
    (["remat", "{f}:loss", "--budget", "min", "--trace", "/no/such/dir/t.json"],
     "--trace '/no/such/dir/t.json': folder '/no/such/dir' does not exist"),
    (["shard", "{f}:train", "--mesh", "pipe=2", "--microbatches", "2", "--trace",
      "/no/such/dir/t.json"], "--trace '/no/such/dir/t.json': folder '/no/such/dir' does not"),
    (["shard", "{f}:train", "--mesh", "data=2", "--trace", "t.json"],
     "--trace is a pipeline option: use it with --mesh [data=D,]pipe=P"),
    (["inspect", "{f}:make", "--html", "/no/such/dir/p.html"],
     "--html '/no/such/dir/p.html': folder '/no/such/dir' does not exist"),
])
def test_bad_output_paths_are_one_line(user_file, capsys, argv, message):
    assert cli.main([a.replace("{f}", user_file) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mlsys-jax: error: ") and message in err


@pytest.mark.slow
def test_shard_pipeline_trace_has_one_track_per_device(user_file, tmp_path, capsys):
    out = tmp_path / "pipe.json"
    assert cli.main(["shard", f"{user_file}:train", "--mesh", "data=2,pipe=2",
                     "--microbatches", "4", "--steps", "1", "--json", "--trace", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    doc = json.loads(out.read_text())
    check_trace(doc)
    names = tracks(doc)
    assert len(names) == 4 and len({n.split("device ")[1] for n in names.values()}) == 4
    for (pid, tid), events in _slices(doc).items():
        kinds = Counter(e["cat"] for e in events)
        assert kinds["forward"] == kinds["backward"] == 4
        assert kinds["bubble"] == report["bubble"]["idle_steps"][tid - 1]
        assert names[(pid, tid)].startswith(f"stage {tid} ")


@pytest.mark.slow
def test_remat_trace_counts_live_bytes_for_no_remat_and_the_plan(user_file, tmp_path, capsys):
    pytest.importorskip("scipy")  # the MILP's solver, as tests/cli/test_remat.py
    out = tmp_path / "remat.json"
    assert cli.main(["remat", f"{user_file}:loss", "--budget", "min", "--repeats", "1",
                     "--no-policies", "--quiet", "--trace", str(out)]) == 0
    assert f"trace written: {out}" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    check_trace(doc)
    series: dict = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "C":
            series.setdefault(e["name"], []).append(e["args"]["bytes"])
    assert set(series) == {"no remat", "the plan"}
    for values in series.values():
        assert min(values) >= 0 and values[-1] == 0 and max(values) > 0
    assert max(series["the plan"]) < max(series["no remat"])  # recomputation holds less
    assert [e["name"] for e in doc["traceEvents"] if e["ph"] == "X"] == ["forward", "backward"]


@pytest.mark.slow
def test_inspect_trace_lays_the_kernels_end_to_end(user_file, tmp_path, capsys):
    out = tmp_path / "kernels.json"
    assert cli.main(["inspect", f"{user_file}:make", "--json", "--measure", "--rounds", "1",
                     "--trace", str(out)]) == 0
    ops = json.loads(capsys.readouterr().out)["ops"]
    doc = json.loads(out.read_text())
    check_trace(doc)
    kernels, [whole] = _slices(doc)[(1, 1)], _slices(doc)[(1, 2)]
    assert [k["dur"] for k in kernels] == [op["time_us"] for op in ops]
    assert [k["args"]["module"] for k in kernels] == [op["module"] for op in ops]
    assert all(b["ts"] == pytest.approx(a["ts"] + a["dur"]) for a, b in zip(kernels, kernels[1:]))
    assert any("[net/block0/mlp]" in k["name"] for k in kernels)
    assert all(k["args"]["time"].startswith("estimated") for k in kernels)
    assert whole["dur"] > 0 and "measured here" in whole["args"]["time"]
