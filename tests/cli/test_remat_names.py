"""``remat`` names the values a plan saves and recomputes by module and primitive
(``Block_0/Dense_0/dot_general``), not by the planner's ``dot_general_7``, and fits 80 columns."""
import re
import textwrap

import jax
import pytest

from mlsys_jax import cli

pytest.importorskip("scipy")

USER_FILE = textwrap.dedent("""
    import jax, jax.numpy as jnp
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            return x + nn.Dense(64)(jnp.tanh(nn.Dense(64)(x)))

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            for _ in range(3):
                x = Block()(x)
            return nn.Dense(8)(x)

    def loss():
        model = Net()
        x = jax.random.normal(jax.random.key(1), (64, 64))
        variables = model.init(jax.random.key(0), x)

        def loss_fn(variables, batch):
            return jnp.mean(jnp.tanh(model.apply(variables, batch["x"])) ** 2)
        return loss_fn, variables, {"x": x}
""")

PLANNER_NAME = re.compile(r"^[a-z_]+_\d+(\.\d+)?$")  # the planner's own: div_7, split_3.1


@pytest.mark.slow
def test_saved_values_are_named_by_module_and_primitive(tmp_path, capsys, monkeypatch):
    path = tmp_path / "net.py"
    path.write_text(USER_FILE)
    monkeypatch.setenv("COLUMNS", "80")
    with jax.enable_x64(False):
        rc = cli.main(["--devices", "8", "remat", f"{path}:loss", "--budget", "min",
                       "--repeats", "1", "--no-policies", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0, out
    listed = out.split("  saved: ")[1].split("\n\n")[0]
    saved, recomputed = listed.split("  recomputed: ")
    names = [n.strip().split(" ")[0] for n in " ".join(saved.split()).split(", ")]
    names = [n for n in names if not n.startswith("…")]
    assert names and not any(PLANNER_NAME.match(n) for n in names)
    assert any(n.startswith("Block_") and "/Dense_" in n for n in names), names
    assert not any(n.startswith("Net/") for n in names)       # the model's own name left out
    lines = out.splitlines()
    assert sum(len(line) <= 80 for line in lines) >= 0.95 * len(lines)
