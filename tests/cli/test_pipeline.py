"""``mlsys-jax shard --mesh [data=D,]pipe=P``: bad input is one line naming the fix, before any
compile (a plain JAX factory written to a temporary file)."""
import textwrap

import pytest

from mlsys_jax import cli

FACTORY = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax

    def train():
        rng = np.random.default_rng(0)
        params = [{"w": rng.standard_normal((4, 4)).astype(np.float32)} for _ in range(3)]
        def loss(p, b):
            h = b["x"]
            for i, layer in enumerate(p):
                with jax.named_scope(f"layer{i}"):
                    h = jnp.tanh(h @ layer["w"])
            return jnp.mean(h ** 2)
        return loss, params, {"x": jnp.ones((8, 4))}, optax.sgd(0.1)
""")


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "stack.py"
    path.write_text(FACTORY)
    return f"{path}:train"


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "pipe=3", "--microbatches", "8"],
     "--mesh pipe=3 uses 3 devices, which does not divide the 8 simulated devices"),
    (["--mesh", "pipe=2", "--microbatches", "1"],
     "--microbatches 1 is fewer than the 2 pipeline stages"),
    (["--mesh", "pipe=2"], "--mesh pipe=2 needs --microbatches M with M >= 2"),
    (["--mesh", "pipe=2", "--microbatches", "4", "--split", "layer1,layer2"],
     "--split names 2 split point(s), which make 3 stages, but the mesh has pipe=2"),
    (["--mesh", "pipe=2", "--microbatches", "4", "--split", "layer7"],
     "--split 'layer7' matches no unit; the units are layer0, layer1, layer2"),
    (["--mesh", "pipe=4", "--microbatches", "4"],
     "pipe=4 needs at least 4 units to cut between, but the model has 3"),
    (["--mesh", "data=2,pipe=2", "--microbatches", "3"],
     "the batch of 8 rows does not split into data=2 x 3 microbatches"),
    (["--mesh", "data=2", "--microbatches", "4"], "--microbatches is a pipeline option"),
    (["--mesh", "pipe=2", "--microbatches", "4", "--zero", "1"], "--zero does not combine"),
    (["--mesh", "pipe=2", "--microbatches", "4", "--axis-rules", "mlp=model"],
     "--axis-rules does not combine with pipe=P"),
    (["--mesh", "pipe=2", "--microbatches", "4", "--plot", "/no/such/dir/t.png"],
     "--plot '/no/such/dir/t.png': folder '/no/such/dir' does not exist"),
])
def test_bad_pipeline_input_is_one_line(capsys, target, argv, message):
    code = cli.main(["shard", target, *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("mlsys-jax: error: ") and message in err
