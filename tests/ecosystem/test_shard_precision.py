"""A flax model that computes in bfloat16 (``nn.Dense(dtype=jnp.bfloat16)``, float32 parameters,
an optax step) under ``shard``: exact within a bound that is bfloat16's rounding, measured, and
named; a mesh whose gradients are scaled by 1.01 is caught; the pipeline path agrees and invents
no cause."""
import json
import textwrap

import jax
import pytest

from mlsys_jax import cli
from mlsys_jax.parallel.shard import step as shard_step

MODEL = textwrap.dedent('''
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            for width in (32,):   # one hidden layer: the pair of matmuls model=2 splits
                x = nn.relu(nn.Dense(width, dtype=jnp.bfloat16)(x))
            return nn.Dense(10, dtype=jnp.bfloat16)(x)

    def train():
        model = MLP()
        kx, ky = jax.random.split(jax.random.key(1))
        batch = {"x": jax.random.normal(kx, (16, 32)),
                 "y": jax.random.randint(ky, (16,), 0, 10)}
        params = model.init(jax.random.key(0), batch["x"])

        def loss_fn(p, b):
            logits = model.apply(p, b["x"]).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, b["y"]).mean()
        return loss_fn, params, batch, optax.adamw(1e-3)
''')


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("bf16") / "bf16_mlp.py"
    path.write_text(MODEL)
    return f"{path}:train"


def shard(capsys, target, *argv):
    code = cli.main(["--devices", "8", "shard", target, *argv, "--json", "--quick-compile",
                     "--steps", "2"])
    return code, json.loads(capsys.readouterr().out)


def _scaled_gradients(monkeypatch, factor):
    """The mesh's step differentiates ``loss + (f − 1)·(loss − stop_gradient(loss))``: the same
    loss value, gradients (and so the update) scaled by ``f``."""
    make = shard_step.make_step

    def scaled(loss):
        def f(t, b):
            v = loss(t, b)
            return v + (factor - 1) * (v - jax.lax.stop_gradient(v))
        return f
    monkeypatch.setattr(shard_step, "make_step",
                        lambda loss, opt, layout=None: make(scaled(loss), opt, layout))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["data=2", "data=2,model=2"])
def test_a_bfloat16_flax_step_is_exact_within_bfloat16s_bound(capsys, target, mesh):
    code, got = shard(capsys, target, "--mesh", mesh)
    assert code == 0 and got["exact"] is True, got["reason"]
    assert "compute in bfloat16, so their bound is bfloat16's" in got["reason"]
    assert got["bound"]["grads"] < 0.01 * got["magnitude"]["grads"]   # not a blanket 16 eps
    if "model" in mesh:
        assert got["tensor_parallel"]["split"]    # tensor parallelism applies


@pytest.mark.slow
def test_a_bfloat16_step_with_gradients_off_by_one_percent_is_not_exact(capsys, target,
                                                                       monkeypatch):
    _scaled_gradients(monkeypatch, 1.01)
    code, got = shard(capsys, target, "--mesh", "data=2")
    assert code == 0 and got["exact"] is False
    assert got["reason"].startswith("the sharded step differs from one device beyond rounding")
    assert "Δgrads" in got["reason"] and "bfloat16" in got["reason"]


@pytest.mark.slow
def test_the_pipeline_path_is_exact_in_bfloat16_and_invents_no_cause(capsys, target):
    code, got = shard(capsys, target, "--mesh", "pipe=2", "--microbatches", "4")
    assert code == 0 and got["exact"] is True and got["separable"], got["reason"]
    assert "couples" not in got["reason"] and "bfloat16" in got["reason"]
