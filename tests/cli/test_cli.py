"""The CLI contract: inspect (text/JSON/DOT), run's argument handling, and one-line user errors."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from mlsys_jax import cli
from mlsys_jax.tables import WIDTH, markdown_table

USER_FILE = textwrap.dedent("""
    import numpy as np, jax, jax.numpy as jnp
    W = np.random.RandomState(0).randn(784, 100).astype(np.float32)   # a closed-over weight
    def layer(x):
        return jax.nn.relu(x @ W)
    def two(x, y):
        return x + y
    def broken(x):
        return x @ jnp.ones((3, 3))
""")


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(USER_FILE)
    return str(path)


def test_inspect_json_counts_closed_over_weights(user_file, capsys):
    assert cli.main(["inspect", f"{user_file}:layer", "--arg", "f32[32,784]", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [op["name"] for op in out["ops"]] == ["matmul", "relu"]
    assert out["ops"][0]["bytes"] == (32 * 784 + 784 * 100 + 32 * 100) * 4  # W read as a const
    assert out["ops"][0]["flops"] == 2 * 32 * 784 * 100
    assert set(out["total"]) >= {"flops", "bytes", "kernels", "time_us", "peak_bytes",
                                 "fused_kernels", "fused_time_us", "xla_flops"}
    assert out["total"]["kernels"] == 2 and out["unknown"] == []
    assert out["total"]["fused_kernels"] == 2  # the relu is alone beside the matmul
    assert out["primitives"]["max"] == 1  # counted recursively, inside relu


def test_inspect_text_grad_fused_and_dot(user_file, tmp_path, capsys):
    dot = tmp_path / "g.dot"
    assert cli.main(["inspect", f"{user_file}:layer", "--arg", "f32[8,784]", "--grad", "--fused",
                     "--hw", "a100", "--dtype", "bf16", "--dot", str(dot), "--jaxpr"]) == 0
    out = capsys.readouterr().out
    assert out.count("dot_general") >= 2 and "ours, fused" in out and "a100" in out
    assert dot.read_text().startswith("digraph")


@pytest.mark.parametrize("argv, message", [
    (["inspect", "{f}:nope", "--arg", "f32[2]"], "no function 'nope'"),
    (["inspect", "missing.py:f", "--arg", "f32[2]"], "file not found"),
    (["inspect", "{f}", "--arg", "f32[2]"], "expected FILE.py:FUNCTION"),
    (["inspect", "{f}:layer", "--arg", "f32[2,x]"], "malformed shape spec"),
    (["inspect", "{f}:layer"], "one --arg SPEC"),
    (["inspect", "{f}:two", "--arg", "f32[2]"], "takes 2 positional"),
    (["inspect", "{f}:broken", "--arg", "f32[2,2]"], "failed to trace"),
    (["inspect", "{f}:layer", "--arg", "f32[2,784]", "--hw", "tpu"], "unknown hardware"),
    (["inspect", "{f}:layer", "--arg", "f32[2,784]", "--dtype", "f7"], "unknown dtype"),
    (["inspect", "{f}:layer", "--arg", "i32[2,784]", "--grad"], "must be a float"),
    (["run", "99"], "unknown experiment"),
    (["run", "01", "--set", "novalue"], "KEY=VALUE"),
])
def test_user_errors_are_one_line(user_file, capsys, argv, message):
    argv = [a.replace("{f}", user_file) for a in argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mlsys-jax: error:") and message in err and "\n" not in err


@pytest.mark.slow
def test_a_real_process_prints_no_traceback(user_file):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-m", "mlsys_jax.cli", "inspect", f"{user_file}:two",
                           "--arg", "f32[2]", "--arg", "f32[3]"], capture_output=True, text=True, env=env)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "failed to trace" in proc.stderr


@pytest.mark.slow
def test_run_fits_120_columns_and_json_keeps_every_column(capsys):
    argv = ["run", "03", "--set", "jax=false", "--set", "milp_budgets=0"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "[schedules]" in text and max(map(len, text.splitlines())) <= WIDTH
    assert cli.main(argv + ["--json"]) == 0
    schedules = json.loads(capsys.readouterr().out)["tables"]["schedules"]
    assert len(markdown_table(schedules).splitlines()[0]) > WIDTH  # too wide to print as is
    assert {"formula_forwards", "lecture_forwards", "predicted_match", "grads_bitwise"} <= set(schedules[0])


@pytest.mark.slow
def test_python_m_experiments_shares_the_error_handling():
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.run([sys.executable, "-m", "experiments", "99"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("experiments: error: unknown experiment '99'")
    assert proc.stderr.count("\n") == 1
