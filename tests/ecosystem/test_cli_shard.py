"""``mlsys-jax shard``: the JSON contract, the text report, --processes, and one-line errors."""
import json
import os
import textwrap

import pytest

from mlsys_jax import cli

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "examples")
KEYS = {"mesh", "zero", "steps", "exact", "reason", "max_abs_diff", "per_device_bytes",
        "collectives", "step_time_ratio"}

BAD = textwrap.dedent("""
    import jax.numpy as jnp, numpy as np, optax
    from jax.sharding import PartitionSpec as P
    params = {"w": jnp.asarray(np.ones((8, 10), np.float32))}
    def loss(p, b):
        return jnp.mean((b["x"] @ p["w"]) ** 2)
    batch = {"x": jnp.ones((16, 8))}
    def three():
        return loss, params, batch
    def not_optax():
        return loss, params, batch, "adam"
    def odd_batch():
        return loss, params, {"x": jnp.ones((6, 8))}, optax.sgd(0.1)
    def bad_rule():
        return loss, params, batch, optax.sgd(0.1), [(r"w", P(None, "model"))]
""")


def shard(capsys, *argv):
    code = cli.main(["shard", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.slow
def test_json_has_every_figure_and_two_processes_equal_one(capsys):
    """One run gives the whole JSON contract (with --time) and the same steps across 2
    processes under ZeRO-2, compared with this process's run: the two claims share the example's
    load, its compiles and the run here. (The command's default of 3 steps is its parser's:
    tests/api/test_speak.py::test_namespace_holds_the_commands_defaults.)"""
    code, out, _ = shard(capsys, f"{EXAMPLES}/flax_mlp.py:train", "--mesh", "data=4",
                         "--zero", "2", "--processes", "2", "--steps", "2", "--json",
                         "--quick-compile", "--time")
    got = json.loads(out)
    assert code == 0 and KEYS <= set(got) and got["exact"] is True
    assert got["mesh"] == {"data": 4} and got["zero"] == 2 and got["steps"] == 2
    assert set(got["max_abs_diff"]) == {"loss", "grads", "params"}
    assert {"measured", "layout", "formula", "expected"} <= set(got["per_device_bytes"])
    assert {(c["kind"], c["axis"]) for c in got["collectives"]} == {("all-reduce", "data"),
                                                                    ("all-gather", "data")}
    assert got["step_time_ratio"] > 0
    pr = got["processes"]
    assert pr["equal"] and pr["ranks_agree"] and pr["count"] == 2
    assert pr["devices_per_process"] == 2 and set(pr["max_abs_diff"]) == set(got["bound"])
    assert all(pr["max_abs_diff"][q] <= got["bound"][q] for q in got["bound"])


@pytest.mark.slow
def test_text_report_says_why_batchnorm_is_not_exact(capsys):
    code, out, _ = shard(capsys, f"{EXAMPLES}/flax_batchnorm.py:train", "--mesh", "data=4",
                         "--quick-compile")
    assert code == 0
    assert "exact: NO - not separable over the batch" in out and "BatchNorm" in out
    assert "collectives of the compiled step" in out and "per-device bytes" in out
    assert "step time: not measured (--time to measure it)" in out   # no timing round ran


def test_time_needs_a_run_on_a_data_model_mesh(capsys, bad_file):
    code, _, err = shard(capsys, f"{bad_file}:odd_batch", "--mesh", "pipe=2", "--time")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--time: the pipeline path" in err and "drop --time" in err


@pytest.fixture
def bad_file(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text(BAD)
    return str(path)


@pytest.mark.parametrize("fn, mesh, match", [
    ("three", "data=4", r"must return \(loss_fn, params, batch, optimizer\[, rules\]\); got a tuple of 3"),
    ("not_optax", "data=4", r"4th item must be an optax GradientTransformation"),
    ("odd_batch", "data=4", r"batch of 6 rows does not split over data=4; use a batch size"),
    ("bad_rule", "data=2,model=4", r"splits dimension 1 \(size 10\) of \['w'\] over model of "
                                   r"size 4, which does not divide it"),
    ("odd_batch", "data=3", r"--mesh data=3 uses 3 devices, which does not divide the 8 "
                            r"simulated devices; use --devices 3"),
    ("three", "data4", r"--mesh: expected data=N\[,model=M\]"),
    ("three", "data=2,data=4", r"--mesh data=2,data=4: axis 'data' is given twice"),
])
def test_bad_input_is_one_line_naming_the_fix(capsys, bad_file, fn, mesh, match):
    import re

    code, _, err = shard(capsys, f"{bad_file}:{fn}", "--mesh", mesh)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert re.search(match, err), err


@pytest.mark.parametrize("flag, match", [
    (["--axis-name", "batch"], r"--axis-name: expected NAME=data"),
    (["--axis-rules", "mlp"], r"--axis-rules: expected LOGICAL=AXIS pairs"),
    (["--axis-name", "batch=model"], r"can only be bound to the mesh's data axis"),
    (["--steps", "0"], r"--steps must be >= 1"),
    (["--steps", str(10**15), "--processes", "2"], r"both runs record every step, about .* on "
                                                   r"disk, more than the .* free"),
])
def test_bad_shard_options_are_one_line(capsys, bad_file, flag, match):
    import re

    code, _, err = shard(capsys, f"{bad_file}:odd_batch", "--mesh", "data=2", *flag)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert re.search(match, err), err
