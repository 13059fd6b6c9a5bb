"""optimize at the size of real models: parameters folded in as constants are not copied into
compiled programs, and folding a large kernel does not take a float64 copy of it."""
import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import ir
from mlsys_jax.ir.interpret import LIFT_BYTES, lifted


def test_large_constants_enter_compiled_programs_as_arguments():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((512, 1024)), jnp.float32)  # 2 MiB
    b = jnp.arange(4.0, dtype=jnp.float32)  # small: stays in the program
    closed = ir.trace(lambda x: (x @ w)[:, :4] + b, jax.ShapeDtypeStruct((2, 512), jnp.float32))
    fn, big = lifted(closed)
    assert w.nbytes >= LIFT_BYTES > b.nbytes
    assert len(big) == 1 and big[0] is w  # the user's array itself, not a copy
    x = jnp.ones((2, 512), jnp.float32)
    hlo = jax.jit(fn).lower(big, x).as_text()
    assert len(hlo) < w.nbytes // 20  # 2 MiB of weights would be megabytes of program text
    np.testing.assert_array_equal(jax.jit(fn)(big, x)[0], ir.interpret(closed, x)[0])


def test_folding_a_kernel_in_blocks_of_channels_gives_the_same_weights(monkeypatch):
    from mlsys_jax.passes import fold_conv_bn
    from mlsys_jax.passes.rewrite import linear
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((3, 3, 4, 8)), jnp.float32)  # HWIO
    scale = jnp.asarray(rng.uniform(0.5, 2.0, 8), jnp.float32)
    shift = jnp.asarray(rng.standard_normal(8), jnp.float32)

    def f(x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y * scale + shift
    closed = ir.trace(f, jax.ShapeDtypeStruct((1, 6, 6, 4), jnp.float32))
    whole = fold_conv_bn()(closed).jaxpr
    monkeypatch.setattr(linear, "_SCALE_BLOCK_BYTES", w.nbytes // 3)  # blocks of 2 channels
    blocks = fold_conv_bn()(closed).jaxpr
    assert whole is not closed and len(whole.consts) == len(blocks.consts) >= 1
    for a, b in zip(whole.consts, blocks.consts):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_optimize_refuses_up_front_what_a_copy_of_its_parameters_would_not_fit(
        tmp_path, monkeypatch, capsys):
    from mlsys_jax import cli, runtime

    model = tmp_path / "wide.py"
    model.write_text("import jax.numpy as jnp\n"
                     "def make():\n"
                     "    return (lambda w, x: x @ w), (jnp.ones((512, 1024)), jnp.ones((2, 512)))\n")
    monkeypatch.setattr(runtime, "available_memory_bytes", lambda: 1 << 20)
    assert cli.main(["optimize", f"{model}:make"]) == 2
    err = capsys.readouterr().err
    assert "a rewritten copy of its 2 MB of constants" in err and "1 MB available" in err
    assert err.count("\n") == 1
