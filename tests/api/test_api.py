"""``mlsys_jax.inspect``, ``optimize`` and ``remat`` on tiny functions: the same JSON as the
commands' ``--json``, a readable repr, the report as text, errors in the API's words."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mlsys_jax
from mlsys_jax import cli
from mlsys_jax.errors import MlsysError
from tests.api import steps

STEPS = os.path.abspath(steps.__file__)


def _cli_json(capsys, *argv) -> dict:
    assert cli.main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_importing_mlsys_jax_and_its_api_does_not_start_jax():
    code = ("import sys, mlsys_jax, mlsys_jax.api; "
            "assert callable(mlsys_jax.inspect) and callable(mlsys_jax.shard); "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(STEPS)) + "/..")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_inspect_a_factory_gives_the_commands_json(capsys):
    ours = mlsys_jax.inspect(f"{STEPS}:predict", x64=False)
    theirs = _cli_json(capsys, "inspect", f"{STEPS}:predict", "--json")
    assert ours.to_json() == theirs
    assert ours["total"]["flops"] == theirs["total"]["flops"] > 0


def test_inspect_a_function_and_its_arguments():
    w, x = jnp.ones((8, 2), jnp.float32), jnp.ones((4, 8), jnp.float32)
    r = mlsys_jax.inspect(lambda w, x: jnp.tanh(x @ w), w, x, hw="cpu")
    flops = r["total"]["flops"]
    assert flops >= 2 * 4 * 8 * 2                       # the matmul's multiply-adds at least
    text = repr(r)
    assert text.startswith("inspect ") and f"<lambda>: {flops / 1e9:.4g} GFLOP" in text
    assert len(text.splitlines()) <= 6 and "16 parameters" in text
    table = r.table()
    assert "[modules" in table and "table(ops=True): one row per kernel" in table
    assert "--ops" not in table and "--jaxpr" not in table
    assert "[kernels" in r.table(ops=True)
    assert "dot_general" in str(r.jaxpr)
    assert "<pre>" in r._repr_html_()


def test_inspect_on_shapes_uses_the_specs():
    r = mlsys_jax.inspect(lambda x: jnp.sin(x) * 2, "f32[16,16]")
    assert r["total"]["flops"] > 0 and r["abstract"] is False


def test_inspect_errors_name_keywords():
    with pytest.raises(MlsysError, match=r"^rounds must be a positive integer, got 0$"):
        mlsys_jax.inspect(lambda x: x * 2, "f32[4]", rounds=0)
    with pytest.raises(MlsysError, match=r"pass one argument per positional parameter after the "
                                         r"function"):
        mlsys_jax.inspect(lambda x, y: x * y)
    with pytest.raises(MlsysError, match=r"^measure_budget sets how long .* add hw='here'|"
                                         r"^measure_budget sets how long"):
        mlsys_jax.inspect(lambda x: x * 2, "f32[4]", measure_budget=1.0)


def test_optimize_gives_the_commands_json_and_verdict(capsys):
    ours = mlsys_jax.optimize(f"{STEPS}:predict", x64=False)
    theirs = _cli_json(capsys, "optimize", f"{STEPS}:predict", "--json")
    assert set(ours.to_json()) == set(theirs)
    assert ours.verdict == theirs["verdict"] and ours.verified == theirs["verified"]
    assert ours["before"] == theirs["before"] and ours["after"] == theirs["after"]
    assert repr(ours).startswith(f"optimize {STEPS}:predict: verified: {ours.verdict}")
    assert "verified:" in ours.table()


def test_optimize_without_constants_keeps_the_parameters_inputs():
    w, x = jnp.full((8, 2), 0.5, jnp.float32), jnp.ones((4, 8), jnp.float32)
    folded = mlsys_jax.optimize(lambda w, x: jnp.tanh(x @ (w * 2)), w, x)
    kept = mlsys_jax.optimize(lambda w, x: jnp.tanh(x @ (w * 2)), w, x, constants=False)
    assert len(folded.after.jaxpr.invars) == 1      # x; w is a constant of the graph
    assert len(kept.after.jaxpr.invars) == 2        # w and x


def test_optimize_errors_name_keywords():
    with pytest.raises(MlsysError, match=r"^alpha and search_budget set the search; add "
                                         r"search=True \(or drop them\)$"):
        mlsys_jax.optimize(lambda x: x * 2, "f32[4]", alpha=2.0)


def _chain_loss(params, batch):
    h = batch["x"]
    for w in params:
        h = jnp.tanh(h @ w)
    return jnp.mean(h ** 2)


def test_remat_of_values_plans_and_checks_the_gradient():
    params = [jnp.full((16, 16), 0.1, jnp.float32) for _ in range(3)]
    batch = {"x": jnp.asarray(np.linspace(-1, 1, 32 * 16).reshape(32, 16), jnp.float32)}
    with jax.enable_x64(False):
        r = mlsys_jax.remat(_chain_loss, params, batch, budget="min", policies=False,
                            repeats=1, progress=False)
    got = r.to_json()
    assert set(got) >= {"budget_bytes", "compiled_temp_bytes", "grads_max_abs_diff"}
    assert got["compiled_temp_bytes"] <= got["budget_bytes"] and got["abstract"] is False
    assert r.plan.compiled_temp_bytes == got["compiled_temp_bytes"]
    assert repr(r).startswith(f"remat _chain_loss: budget {got['budget_bytes']:,} bytes")
    assert "[the plan, compiled and timed]" in r.table()


def test_remat_errors_name_keywords():
    params, batch = [jnp.ones((4, 4))], {"x": jnp.ones((2, 4))}
    with pytest.raises(MlsysError, match=r"^repeats must be a positive int, got 0$"):
        mlsys_jax.remat(_chain_loss, params, batch, budget="50%", repeats=0)
    with pytest.raises(MlsysError, match=r"^budget must be .*; got 'lots'$"):
        mlsys_jax.remat(_chain_loss, params, batch, budget="lots")


def test_remat_is_still_the_package_of_the_planners():
    import mlsys_jax.remat.milp

    assert mlsys_jax.remat.milp.Plan is mlsys_jax.remat.Plan and callable(mlsys_jax.remat)
