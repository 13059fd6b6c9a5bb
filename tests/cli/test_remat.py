"""``mlsys-jax remat``: the JSON contract and one-line errors for bad factories and budgets."""
import json
import re
import textwrap

import pytest

from mlsys_jax import cli
from mlsys_jax.cli.commands.remat import JSON_KEYS

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
    def train():
        import optax
        return _loss, _params(), _batch(), optax.adam(1e-3)
    def int_leaf():
        return _loss, dict(_params(), steps=jnp.arange(3)), _batch()
    def raises():
        raise RuntimeError("no data here")
""")


PROGRESS = re.compile(r"mlsys-jax remat: \[ *\d+\.\d s\] .+")


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
    ("pair", "50%", r"must return \(loss_fn, params, batch\[, optimizer\[, rules\]\]\); got "
                    r"a tuple of 2"),
    ("int_leaf", "50%", r"parameter leaf params\['steps'\] is int32\[3\]"),
    ("raises", "50%", r"factory .*:raises failed: RuntimeError: no data here"),
    ("loss", "12x", "budget must be a positive byte count"),
    ("loss", "1", r"below the minimum (\d+) bytes .* at least \1"),
])
def test_bad_input_is_one_line(user_file, capsys, fn, budget, message):
    assert cli.main(["remat", f"{user_file}:{fn}", "--budget", budget, "--repeats", "1"]) == 2
    *progress, err = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("mlsys-jax: error: ") and re.search(message, err), err
    assert all(PROGRESS.fullmatch(line) for line in progress), progress   # the work done before


@pytest.mark.parametrize("budget, why", [("inf", "not a finite number"),
                                         ("inf%", "not a finite number"),
                                         ("NaN", "not a finite number"), ("-5", "negative"),
                                         ("-1%", "negative")])
def test_budgets_that_mean_nothing_are_one_line(user_file, capsys, budget, why):
    assert cli.main(["remat", f"{user_file}:loss", f"--budget={budget}"]) == 2
    err = capsys.readouterr().err.strip()           # refused before any work: no progress
    assert len(err.splitlines()) == 1 and err.startswith("mlsys-jax: error: budget must be")
    assert why in err


@pytest.mark.slow
def test_the_shard_factory_with_progress_a_note_and_json_only_on_stdout(user_file, capfd):
    assert cli.main(["remat", f"{user_file}:train", "--budget", "100%", "--json",
                     "--no-policies", "--repeats", "1"]) == 0
    out, err = capfd.readouterr()
    assert list(json.loads(out)) == list(JSON_KEYS) and json.loads(out)["policies"] == []
    lines = err.splitlines()
    first = re.fullmatch(r"mlsys-jax remat: \[ *(\d+\.\d) s\] loading .*", lines[0])
    assert first and float(first.group(1)) < 5          # printed before the factory runs: ~0.0 s
    assert any("optimizer is ignored" in ln for ln in lines)
    assert any("compiling no remat" in ln for ln in lines)


@pytest.mark.slow
def test_min_zero_and_zero_percent_ask_for_the_least(user_file, capfd):
    outs = []
    for budget in ("min", "0", "0%"):
        assert cli.main(["remat", f"{user_file}:loss", "--budget", budget, "--json", "--quiet",
                         "--no-policies", "--repeats", "1"]) == 0
        out, err = capfd.readouterr()
        assert err == ""                                   # --quiet: no progress
        outs.append(json.loads(out))
    assert outs[0]["budget_bytes"] == outs[0]["compiled_temp_bytes"]    # the least, reported
    assert all(o["compiled_temp_bytes"] == outs[0]["compiled_temp_bytes"] for o in outs)
