"""``mlsys-jax remat``: the JSON contract and one-line errors for bad factories and budgets."""
import json
import re
import textwrap

import pytest

from mlsys_jax import cli
from mlsys_jax.cli.remat import JSON_KEYS

pytest.importorskip("scipy")

USER_FILE = textwrap.dedent("""
    import jax, jax.numpy as jnp
    def _loss(p, b):
        h = jnp.tanh(b["x"] @ p["w1"])
        logits = jnp.tanh(h @ p["w2"]) @ p["w3"]
        return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(32), b["y"]])
    def _params():
        k = jax.random.split(jax.random.key(0), 3)
        return {"w1": jax.random.normal(k[0], (16, 64)) / 4,
                "w2": jax.random.normal(k[1], (64, 64)) / 8,
                "w3": jax.random.normal(k[2], (64, 8)) / 8}
    def _batch():
        return {"x": jnp.ones((32, 16)), "y": jnp.arange(32) % 8}
    def loss():
        return _loss, _params(), _batch()
    def pair():
        return _loss, _params()
    def int_leaf():
        return _loss, dict(_params(), steps=jnp.arange(3)), _batch()
    def raises():
        raise RuntimeError("no data here")
""")


@pytest.fixture
def user_file(tmp_path):
    (tmp_path / "model.py").write_text(USER_FILE)
    return str(tmp_path / "model.py")


@pytest.mark.slow
def test_json_has_exactly_the_documented_keys(user_file, capsys):
    assert cli.main(["remat", f"{user_file}:loss", "--budget", "100%", "--json",
                     "--repeats", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == list(JSON_KEYS)
    assert [set(p) for p in out["policies"]] == [{"name", "compiled_temp_bytes",
                                                  "compiled_flops", "step_time_ratio"}] * 5
    assert out["recomputed"] == [] and out["grads_max_abs_diff"] == 0.0
    assert out["compiled_temp_bytes"] <= out["budget_bytes"] and out["step_time_ratio"] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("fn, budget, message", [
    ("pair", "50%", r"must return \(loss_fn, params, batch\); got a tuple of 2"),
    ("int_leaf", "50%", r"parameter leaf params\['steps'\] is int32\[3\]"),
    ("raises", "50%", r"factory .*:raises failed: RuntimeError: no data here"),
    ("loss", "12x", "budget must be a positive byte count"),
    ("loss", "1", r"below the minimum (\d+) bytes .* at least \1"),
])
def test_bad_input_is_one_line(user_file, capsys, fn, budget, message):
    assert cli.main(["remat", f"{user_file}:{fn}", "--budget", budget, "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mlsys-jax: error: ")
    assert re.search(message, err), err
