"""``inspect``'s default output for people: no jaxpr unless asked, each module's input and output
shapes, parameters apart from state (BatchNorm's statistics), the FLOP convention and XLA's own
figures beside ours, Keras arrays named by their variable paths, a report that fits 80 columns,
and progress on stderr only for stages that run long."""
import io
import json
import os
import textwrap
import time

import jax
import pytest

from mlsys_jax import cli
from mlsys_jax.cli.headline import flops_of

PLAIN = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np

    def net(p, x):
        with jax.named_scope("body"):
            with jax.named_scope("up"):
                h = jnp.tanh(x @ p["up"])
            with jax.named_scope("down"):
                return h @ p["down"]

    def make():
        rng = np.random.default_rng(0)
        w = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
        return net, ({"up": w(8, 32), "down": w(32, 4)}, w(2, 8))
""")

FLAX = textwrap.dedent("""
    import flax.linen as nn, jax, jax.numpy as jnp

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.BatchNorm(use_running_average=True)(nn.Dense(8)(x))
            return nn.Dense(2)(nn.relu(x))

    def make():
        model, x = Net(), jnp.ones((4, 3))
        return model.apply, (model.init(jax.random.key(0), x), x)
""")

NNX = textwrap.dedent("""
    import jax, jax.numpy as jnp
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(3, 8, rngs=rngs)
            self.norm = nnx.BatchNorm(8, use_running_average=True, rngs=rngs)

        def __call__(self, x):
            return self.norm(self.dense(x))

    def make():
        return (lambda model, x: model(x)), (Net(nnx.Rngs(0)), jnp.ones((4, 3)))
""")

EQUINOX = textwrap.dedent("""
    import equinox as eqx, jax, jax.numpy as jnp

    class Net(eqx.Module):
        dense: eqx.nn.Linear
        norm: eqx.nn.BatchNorm

        def __init__(self, key):
            self.dense = eqx.nn.Linear(3, 8, key=key)
            self.norm = eqx.nn.BatchNorm(8, axis_name="batch", mode="ema")

        def __call__(self, x, state):
            return self.norm(self.dense(x), state)

    def forward(model, x, state):
        return jax.vmap(model, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(
            x, state)[0]

    def make():
        model, state = eqx.nn.make_with_state(Net)(jax.random.key(0))
        return forward, (eqx.nn.inference_mode(model), jnp.ones((4, 3)), state)
""")

KERAS = textwrap.dedent("""
    import os
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax.numpy as jnp, keras

    def make():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, name="dense"),
                                  keras.layers.BatchNormalization(name="norm"),
                                  keras.layers.Dense(2, name="head")])
        trainable = [v.value for v in model.trainable_variables]
        frozen = [v.value for v in model.non_trainable_variables]

        def apply(variables, x):
            return model.stateless_call(*variables, x, training=False)[0]
        return apply, ((trainable, frozen), jnp.ones((4, 3)))
""")


def _file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return f"{path}:make"


def _run(capsys, *argv):
    with jax.enable_x64(False):
        rc = cli.main(["--devices", "8", "inspect", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _json(capsys, *argv) -> dict:
    rc, out, err = _run(capsys, *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def _rows(d: dict) -> dict:
    return {"/".join(m["path"]): m for m in d["modules"]}


def test_the_jaxpr_is_printed_only_when_asked(tmp_path, capsys):
    target = _file(tmp_path, "plain", PLAIN)
    rc, text, err = _run(capsys, target)
    assert rc == 0 and "{ lambda" not in text and err == ""  # a fast run: no progress either
    assert "--jaxpr: the jaxpr (" in " ".join(text.split())
    rc, shown, _ = _run(capsys, target, "--jaxpr", "--no-xla")
    assert rc == 0 and "{ lambda" in shown and "dot_general" in shown


def test_modules_have_their_input_and_output_shapes(tmp_path, capsys):
    d = _json(capsys, _file(tmp_path, "plain", PLAIN), "--no-xla")
    rows = _rows(d)
    assert d["model"] == "body"  # the table's top: the model, its input and output
    assert d["inputs"] == ["f32[2,8]"] and d["outputs"] == ["f32[2,4]"]  # the parameters aside
    assert rows["body/up"]["inputs"] == ["f32[2,8]"] and rows["body/up"]["outputs"] == [
        "f32[2,32]"]
    assert rows["body/down"]["inputs"] == ["f32[2,32]"] and rows["body/down"]["outputs"] == [
        "f32[2,4]"]
    rc, text, _ = _run(capsys, _file(tmp_path, "plain", PLAIN), "--no-xla")
    table = text[text.index("[modules"):]
    assert "out (f32)" in table and "[2,32]" in table  # the compact column, dtype in its header


def test_xla_figures_and_the_flop_convention_beside_ours(tmp_path, capsys):
    target = _file(tmp_path, "plain", PLAIN)
    d = _json(capsys, target)
    matmuls = flops_of(lambda x, w: x @ w, (2, 8), (8, 32)) + flops_of(
        lambda h, w: h @ w, (2, 32), (32, 4))
    assert matmuls == 2 * (2 * 8 * 32 + 2 * 32 * 4)  # 2 per multiply-add, as the line says
    total = d["total"]
    assert total["flops"] == matmuls + 2 * 32  # and tanh: 1 per element
    assert 0.9 * total["flops"] <= total["xla_flops"] <= 1.1 * total["flops"]
    assert total["xla_argument_bytes"] == 4 * (8 * 32 + 32 * 4 + 2 * 8)
    assert total["xla_output_bytes"] == 4 * 2 * 4
    assert d["flop_convention"].startswith("FLOPs (ours): 2 per multiply-add")
    rc, text, _ = _run(capsys, target)
    lines = text.splitlines()
    xla = next(line for line in lines if line.split("|")[0].strip() == "XLA")
    assert f"{total['xla_flops'] / 1e3:.4g}" in xla
    assert any(line.startswith("FLOPs (ours): 2 per multiply-add") for line in lines)
    no_xla = _json(capsys, target, "--no-xla")
    assert "xla_flops" not in no_xla["total"] and no_xla["total"]["flops"] == total["flops"]


def test_the_report_fits_80_columns(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    rc, text, _ = _run(capsys, _file(tmp_path, "plain", PLAIN))
    assert rc == 0 and max(map(len, text.splitlines())) <= 80
    assert "left out to fit: in (f32)" in " ".join(text.split())  # and names what it left out
    monkeypatch.setenv("COLUMNS", "200")
    rc, wide, _ = _run(capsys, _file(tmp_path, "plain", PLAIN))
    assert "left out to fit" not in wide and "in (f32)" in wide


def test_a_slow_stage_shows_progress_a_fast_one_does_not(monkeypatch):
    from mlsys_jax import progress as module

    monkeypatch.setattr(module, "SLOW_S", 0.05)
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    with module.SlowStages("mlsys-jax inspect") as progress:
        progress.stage("fast")
        progress.stage("slow")
        time.sleep(0.3)
        progress.stage("after a slow one")
    lines = err.getvalue().splitlines()
    assert [line.split("] ")[-1] for line in lines] == ["slow", "after a slow one"]
    err.truncate(0)
    with module.SlowStages("mlsys-jax inspect", enabled=False) as quiet:
        quiet.stage("slow")
        time.sleep(0.1)
    assert err.getvalue() == ""


@pytest.mark.ecosystem
def test_flax_batch_statistics_are_state_not_parameters(tmp_path, capsys):
    pytest.importorskip("flax")
    d = _json(capsys, _file(tmp_path, "flax_bn", FLAX), "--no-xla")
    norm = _rows(d)["Net/BatchNorm_0"]
    assert (norm["params"], norm["state"], norm["state_bytes"]) == (2 * 8, 2 * 8, 4 * 2 * 8)
    assert d["params"] == (3 * 8 + 8) + 2 * 8 + (8 * 2 + 2) and d["state"] == 2 * 8
    kinds = {v["name"]: v["kind"] for v in d["variables"]}
    assert kinds["['batch_stats']['BatchNorm_0']['mean']"] == "state"
    assert kinds["['params']['BatchNorm_0']['scale']"] == "param"
    rc, text, _ = _run(capsys, _file(tmp_path, "flax_bn", FLAX), "--no-xla")
    assert f"{d['params']:,} parameters" in text and "state 16 (" in text


@pytest.mark.ecosystem
@pytest.mark.parametrize("name, source, norm", [("nnx_bn", NNX, "norm"),
                                                ("eqx_bn", EQUINOX, "norm")])
def test_nnx_and_equinox_statistics_are_state(tmp_path, capsys, name, source, norm):
    pytest.importorskip("flax" if name.startswith("nnx") else "equinox")
    d = _json(capsys, _file(tmp_path, name, source), "--no-xla")
    assert d["params"] == (3 * 8 + 8) + 2 * 8
    assert d["state"] >= 2 * 8  # the running mean and variance (equinox adds a flag or two)
    assert _rows(d)[norm]["state"] == 2 * 8 and _rows(d)[norm]["params"] == 2 * 8


@pytest.mark.ecosystem
def test_keras_arrays_are_named_by_their_variable_paths(tmp_path, capsys):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip(f"keras was imported with the {keras.backend.backend()} backend")
    d = _json(capsys, _file(tmp_path, "keras_bn", KERAS), "--no-xla")
    kinds = {v["name"]: v["kind"] for v in d["variables"]}  # a Sequential names its layers'
    assert {kinds[f"sequential/{n}"] for n in ("dense/kernel", "norm/gamma", "head/bias")} == {
        "param"}
    assert kinds["sequential/norm/moving_mean"] == kinds["sequential/norm/moving_variance"] == (
        "state")
    assert d["params"] == (3 * 8 + 8) + 2 * 8 + (8 * 2 + 2) and d["state"] == 2 * 8
    rows = _rows(d)
    assert rows["norm"]["state"] == 2 * 8 and rows["dense"]["outputs"] == ["f32[4,8]"]
