"""``ir.precision``: the least precise dtype each output's computation passes through, ulps, and
the split-contraction computation that measures a mesh's narrow rounding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.ir.precision import gradient_dtypes, least_precise_dtype, narrow, split_sums, ulp


def _mixed(x, y):
    bf = (y.astype(jnp.bfloat16) * 2).astype(jnp.float32)            # through bfloat16
    called = jax.jit(lambda a, b: (a + 1, b.astype(jnp.float16)))(x, y)
    scanned = jax.lax.scan(lambda c, _: (c + x.astype(jnp.float16).astype(jnp.float32)[0], None),
                           jnp.float32(0), None, length=2)[0]
    return x * 2, bf, called[0], called[1], scanned


def test_each_output_gets_the_dtype_of_its_own_dataflow():
    x = y = jnp.ones(3, jnp.float32)
    got = least_precise_dtype(jax.make_jaxpr(_mixed)(x, y))
    # x*2 never leaves float32; the cast output is bfloat16's; a jit body is followed output
    # by output; a loop body counts whole
    assert [str(d) for d in got] == ["float32", "bfloat16", "float32", "float16", "float16"]
    assert [narrow(d) for d in got] == [None, "bfloat16", None, "float16", "float16"]


def test_gradients_of_a_bfloat16_matmul_with_float32_parameters_are_bfloat16s():
    def loss(p, b):
        h = (b.astype(jnp.bfloat16) @ p["w"].astype(jnp.bfloat16)).astype(jnp.float32)
        return jnp.mean(h ** 2) + jnp.sum(p["v"] ** 2)
    p = {"w": jnp.ones((4, 3), jnp.float32), "v": jnp.ones(2, jnp.float32)}
    # leaves in key order: v (float32 throughout), w (its matmul in bfloat16)
    assert gradient_dtypes(loss, p, jnp.ones((5, 4), jnp.float32)) == \
        (("bfloat16",), (None, "bfloat16"))


def test_a_float32_loss_needs_no_gradient_trace(monkeypatch):
    traced = []
    monkeypatch.setattr(jax, "value_and_grad", lambda f: traced.append(f) or f)
    p = {"w": jnp.ones((4, 3), jnp.float32)}
    out = gradient_dtypes(lambda p, b: jnp.sum(b @ p["w"]), p, jnp.ones((2, 4), jnp.float32))
    assert out == ((None,), (None,)) and not traced


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_ulp_is_the_spacing_of_the_dtype(dtype):
    for x in (0.2, 0.125, 1.0, 3.0, 1000.0):
        assert ulp(dtype, x) == float(np.spacing(np.asarray(x, jnp.dtype(dtype))))
    assert ulp(dtype, 0.0) == 0.0 and ulp("int32", 3.0) == 0.0


def test_split_sums_rounds_each_partial_product_and_equals_the_mathematics():
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((8, 64)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((64, 16)), jnp.bfloat16)
    closed = jax.make_jaxpr(lambda a, w: (a @ w).astype(jnp.float32))(a, w)
    split = split_sums(closed, 2)(a, w)[0]          # eagerly: every operation rounds to bf16
    halves = (a[:, :32] @ w[:32]) + (a[:, 32:] @ w[32:])
    assert np.array_equal(np.asarray(split), np.asarray(halves.astype(jnp.float32)))
    exact = np.asarray(a, np.float64) @ np.asarray(w, np.float64)
    plain = np.asarray((a @ w).astype(jnp.float32), np.float64)
    assert not np.array_equal(np.asarray(split), plain)          # another rounding...
    assert np.max(np.abs(np.asarray(split) - exact)) < 8 * ulp("bfloat16", np.abs(exact).max())
    g = jax.grad(lambda w: jnp.sum(split_sums(closed, 2)(a, w)[0]))(w)  # ...differentiable
    assert g.shape == w.shape
