"""``--hw here`` on the command line: ``inspect``'s measured columns and ``--measure``, the
budget, ``optimize --measure``'s predictions beside its measurements, and the options ``here``
refuses. The model's own bookkeeping is in ``tests/cost/test_here.py``."""
import contextlib
import io
import json

import pytest

from mlsys_jax import cli
from mlsys_jax.cost import cache
from mlsys_jax.cost.here import OperatorModel, operators
from mlsys_jax.cost.here.dispatch import DispatchCost

SOURCE = '''
import jax.numpy as jnp

def layer(x, w):
    return jnp.tanh(x @ w).sum(axis=0)
'''
ARGS = ("--arg", "f32[32,32]", "--arg", "f32[32,32]")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A user's file, and a cache of this module's own whose ``here`` model measures quickly."""
    root = tmp_path_factory.mktemp("here_cli")
    (root / "model.py").write_text(SOURCE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))
        model = OperatorModel(repeats=2, min_time_s=2e-4, progress=False)
        model.entries["dispatch"] = DispatchCost(5.0, 0.3, 1.0, 0.4).to_dict()  # not measured
        operators._MODELS[cache.cache_dir()] = model
        yield str(root / "model.py") + ":layer"


def run(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(list(argv))
    return rc, out.getvalue()


@pytest.mark.slow
def test_inspect_measures_the_kernels_then_reads_them_and_times_the_whole_function(target):
    rc, out = run("inspect", target, *ARGS, "--hw", "here", "--measure", "--rounds", "2", "--json")
    assert rc == 0, out
    d = json.loads(out)
    assert [op["model"] for op in d["ops"]] and {op["model"] for op in d["ops"]} <= {"measured",
                                                                                      "cached"}
    m = d["measured"]
    assert m["predicted_us"] == pytest.approx(d["total"]["fused_time_us"])  # the table's model
    assert m["rounds"] == 2 and 0 < m["min_us"] <= m["median_us"] <= m["max_us"]
    assert m["predicted_over_measured"] == pytest.approx(m["predicted_us"] / m["median_us"])
    rc, out = run("inspect", target, *ARGS, "--hw", "here", "--json")
    assert {op["model"] for op in json.loads(out)["ops"]} == {"cached"}


def test_inspect_table_names_each_rows_model_and_the_least_efficient_kernels(target):
    # 128x128 operands: the kernels run well above the dispatch cost (at 32x32 the tanh and the
    # sum can fall within it, and a kernel within dispatch noise has no x_roofline)
    args = ("--arg", "f32[128,128]", "--arg", "f32[128,128]")
    run("inspect", target, *args, "--hw", "here", "--json")  # measured (or read) and cached
    rc, out = run("inspect", target, *args, "--hw", "here", "--ops")  # the per-kernel table
    _, js = run("inspect", target, *args, "--hw", "here", "--json")  # the same cached kernels
    rated = [op for op in json.loads(js)["ops"] if op["x_roofline"] is not None]  # measured ones
    assert rated, json.loads(js)["ops"]
    worst = max(rated, key=lambda op: op["x_roofline"])["name"]
    assert rc == 0 and "x_roofline" in out and f"least efficient {worst} (" in out
    assert "one call per op (eager), measured" in out and "on the roofline" in out


def test_no_budget_keeps_the_roofline_and_the_next_command_has_its_own(target):
    rc, out = run("inspect", target, "--arg", "f32[8,24]", "--arg", "f32[24,8]", "--hw", "here",
                  "--measure-budget", "0", "--json")
    ops = json.loads(out)["ops"]
    assert rc == 0 and {op["model"] for op in ops} == {"roofline"}
    assert all("--measure-budget" in op["why"] for op in ops)
    rc, out = run("inspect", target, "--arg", "f32[8,24]", "--arg", "f32[24,8]", "--hw", "here",
                  "--json")
    assert {op["model"] for op in json.loads(out)["ops"]} == {"measured"}


@pytest.mark.slow
def test_optimize_measure_puts_each_graphs_prediction_beside_its_time(target):
    rc, out = run("optimize", target, *ARGS, "--hw", "here", "--measure", "--rounds", "2",
                  "--json")
    d = json.loads(out)
    assert rc == 0 and d["verified"]
    assert d["measured"]["original_predicted_us"] == pytest.approx(d["before"]["fused_time_us"])
    assert d["measured"]["optimized_predicted_us"] == pytest.approx(d["after"]["fused_time_us"])


@pytest.mark.parametrize("argv, message", [
    (("inspect", "--hw", "here", "--dtype", "bf16"), "own dtypes"),
    (("inspect", "--hw", "here", "--measure-budget", "-1"), "--measure-budget must be"),
    (("inspect", "--hw", "cpu", "--measure-budget", "5"), "add --hw here"),
    (("inspect", "--hw", "here", "--measure", "--rounds", "0"), "--rounds must be"),
    (("optimize", "--search", "--hw", "here", "--alpha", "2"), "drop --alpha"),
])
def test_here_refuses_options_it_cannot_honour(target, capsys, argv, message):
    rc = cli.main([argv[0], target, *ARGS, *argv[1:]])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.startswith("mlsys-jax: error:")
