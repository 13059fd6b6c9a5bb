"""A loss JAX cannot differentiate (a while_loop with dynamic bounds, a pure_callback without a
JVP) is the user's program, not our bug: remat, shard and plan say so in one line naming the
user's line, exit 2 (it was exit 70, "a bug in mlsys-jax")."""
import textwrap

import pytest

from mlsys_jax import cli

pytestmark = pytest.mark.slow   # three commands each load a factory and trace its gradient

FACTORIES = textwrap.dedent("""
    import jax, jax.numpy as jnp, optax

    def while_loop():
        def loss(p, b):
            y = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * p["w"]),
                                   (0, b["x"]))[1]
            return jnp.mean(y ** 2)
        return loss, {"w": jnp.ones((4,))}, {"x": jnp.ones((8, 4))}, optax.sgd(0.1)

    def callback():
        def loss(p, b):
            y = jax.pure_callback(lambda a: a * 2, jax.ShapeDtypeStruct((8, 4), jnp.float32),
                                  b["x"] * p["w"])
            return jnp.mean(y ** 2)
        return loss, {"w": jnp.ones((4,))}, {"x": jnp.ones((8, 4))}, optax.sgd(0.1)
""")


@pytest.mark.parametrize("factory, line", [("while_loop", 6), ("callback", 13)])
@pytest.mark.parametrize("command", [["remat", "--budget", "50%"],
                                     ["shard", "--mesh", "data=2", "--steps", "1"],
                                     ["plan", "--devices", "8", "--quiet"]])
def test_a_loss_jax_cannot_differentiate_is_the_users_failure(tmp_path, capsys, factory, line,
                                                              command):
    path = tmp_path / "losses.py"
    path.write_text(FACTORIES)
    code = cli.main([command[0], f"{path}:{factory}", *command[1:]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert err[-1].startswith(f"mlsys-jax: error: jax.grad of loss_fn fails at losses.py:{line}")
