"""``mlsys_jax.shard``: the command's verdict and JSON in this process or, when JAX started with
too few devices, from a child process; errors in the API's words."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import mlsys_jax
from mlsys_jax import cli
from mlsys_jax.errors import MlsysError
from tests.api import steps

STEPS = os.path.abspath(steps.__file__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(STEPS)))


def _cli_json(capsys, *argv) -> dict:
    assert cli.main(["shard", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_a_factory_here_gives_the_commands_json(capsys):
    ours = mlsys_jax.shard(f"{STEPS}:linear", mesh={"data": 4}, zero=1, steps=2,
                           quick_compile=True, progress=False)
    theirs = _cli_json(capsys, f"{STEPS}:linear", "--mesh", "data=4", "--zero", "1", "--steps",
                       "2", "--quick-compile")
    assert ours.where == "in this process" and ours.devices == 8
    assert (ours.verdict, ours.exact) == ("yes", theirs["exact"]) == ("yes", True)
    assert ours["max_abs_diff"] == theirs["max_abs_diff"]
    assert set(ours.to_json()) == set(theirs)
    head = repr(ours).splitlines()
    assert head[0].startswith(f"shard {STEPS}:linear: mesh={{'data': 4}}, ZeRO-1, 2 steps")
    assert head[1].startswith("exact: yes - ")
    assert "collectives of the compiled step" in ours.table()
    assert "step time: not measured (time=True to measure it)" in ours.table()


@pytest.mark.slow
def test_values_and_a_function_object_give_the_same_verdict():
    by_function = mlsys_jax.shard(steps.linear, mesh={"data": 2}, steps=1, quick_compile=True,
                                  progress=False)
    loss_fn, params, batch, optimizer = steps.linear()
    by_values = mlsys_jax.shard(loss_fn, params, batch, optimizer, mesh={"data": 2}, steps=1,
                                quick_compile=True, progress=False)
    assert by_function.verdict == by_values.verdict == "yes"
    assert by_function["max_abs_diff"] == by_values["max_abs_diff"]
    assert by_values.name == "loss"


@pytest.mark.parametrize("call, match", [
    (lambda: mlsys_jax.shard(steps.six_rows, mesh={"data": 8}, progress=False),
     r"^the batch of 6 rows does not split over data=8; use a batch size divisible by 8 or "
     r"mesh=\{'data': D\} with D in \[1, 2, 3, 6\]$"),
    (lambda: mlsys_jax.shard(steps.linear, mesh={"data": 4}, zero=5),
     r"^zero=5: choose one of 0, 1, 2, 3$"),
    (lambda: mlsys_jax.shard(steps.linear, mesh={"data": 4}, steps=0, progress=False),
     r"^steps must be >= 1, got 0$"),
    (lambda: mlsys_jax.shard(steps.linear, mesh="data=4"), r"^mesh='data=4': give axis sizes"),
    (lambda: mlsys_jax.shard(steps.linear), r"^shard needs mesh=\{'data': N\}"),
    (lambda: mlsys_jax.shard(lambda: steps.linear(), mesh={"data": 3}),
     r"^shard\(mesh=\{'data': 3\}\) needs 3 devices and JAX here has 8; set XLA_FLAGS="
     r"--xla_force_host_platform_device_count=3 \(set before importing jax\), or pass a "
     r"factory a child process can import"),
])
def test_errors_speak_the_keywords(call, match):
    with pytest.raises(MlsysError, match=match) as e:
        call()
    assert "--mesh" not in str(e.value) and "--zero" not in str(e.value)


CHILD = textwrap.dedent("""
    import json
    import jax
    assert len(jax.devices()) == 1            # a notebook's process: JAX started, one device
    import mlsys_jax
    from tests.api import steps
    by_path = mlsys_jax.shard({path!r}, mesh={{"data": 4}}, steps=1, quick_compile=True,
                              progress=False)
    by_function = mlsys_jax.shard(steps.linear, mesh={{"data": 4}}, steps=1, quick_compile=True,
                                  progress=False)
    try:
        mlsys_jax.shard({path!r}, mesh={{"data": 3}}, quick_compile=True, progress=False)
    except mlsys_jax.errors.MlsysError as e:
        error = str(e)
    print(json.dumps({{"path": by_path.to_json(), "function": by_function.to_json(),
                      "where": by_function.where, "verdicts": [by_path.verdict,
                      by_function.verdict], "error": error}}))
""")


@pytest.mark.slow
def test_a_process_with_one_device_gets_the_commands_verdict(capsys, tmp_path):
    """The acceptance: JAX already started with one device; the mesh runs in a child process
    and gives what ``mlsys-jax --devices 8 shard ... --json`` gives. The factory is the API
    tests' linear step (a module file the child imports again, as a notebook's own module
    would be), one step each: what is proved is the route through the child, not a model."""
    script = tmp_path / "notebook.py"
    script.write_text(CHILD.format(path=f"{STEPS}:linear"))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    theirs = _cli_json(capsys, f"{STEPS}:linear", "--mesh", "data=4", "--steps", "1",
                       "--quick-compile")
    assert got["where"] == "in a child process"
    for run in (got["path"], got["function"]):
        assert (run["exact"], run["reason"].split(";")[0]) == (
            theirs["exact"], theirs["reason"].split(";")[0])
        assert run["mesh"] == theirs["mesh"] == {"data": 4}
        assert run["steps"] == theirs["steps"] == 1
    assert got["verdicts"] == ["yes", "yes"]
    assert got["error"].startswith("the batch of 8 rows does not split over data=3")
    assert "mesh={'data': D}" in got["error"] and "--mesh" not in got["error"]
