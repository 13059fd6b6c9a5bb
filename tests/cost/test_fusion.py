"""The cost model's fusion models and calls: a jitted function costs what its body costs, the
lecture's named ops stay one kernel, XLA:CPU's loop fusion, PRNG keys and huge sizes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import cost, ir, models
from mlsys_jax.cost.fusion import group
from mlsys_jax.errors import MlsysError

CPU_LIKE = cost.Hardware("cpu-like", {"f32": 1e11}, 2e10, 1e-6, fusion="loop", epilogue=False,
                         fused_default=True)  # the 'cpu' model's shape, without calibrating


class Scaled:
    """A module-like pytree: an array leaf and two non-array leaves (as equinox modules have)."""

    def __init__(self, w, axis_name, act):
        self.w, self.axis_name, self.act = w, axis_name, act


jax.tree_util.register_pytree_node(
    Scaled, lambda m: ((m.w, m.axis_name, m.act), None), lambda _, c: Scaled(*c))


def _block(jit: bool):
    p = models.resnet_block_init(jax.random.key(0), 8)
    f = lambda x: models.resnet_block(p, x)  # noqa: E731
    return ir.trace(jax.jit(f) if jit else f, jax.ShapeDtypeStruct((2, 8, 10, 10), jnp.float32))


@pytest.mark.slow
@pytest.mark.parametrize("hw", ["h100", CPU_LIKE])
@pytest.mark.parametrize("fused", [False, True])
def test_a_jitted_function_costs_what_its_body_costs(hw, fused):
    assert len(ir.op_view(_block(True))) == 1  # the op view still sees one named call
    plain, jitted = (cost.estimate(_block(j), hw=hw, fused=fused) for j in (False, True))
    assert [k.name for k in jitted.kernels] == [k.name for k in plain.kernels]
    assert jitted.total_flops == plain.total_flops and jitted.total_bytes == plain.total_bytes
    assert jitted.time_us == pytest.approx(plain.time_us, rel=1e-12)


def test_named_calls_that_are_one_kernel_stay_one():
    params = models.mlp_init(jax.random.key(0))
    x, y = models.mnist_batch(jax.random.key(1), 32)
    r = cost.estimate(ir.trace(models.mlp_loss, params, x, y), fused=False)
    assert [k.name for k in r.kernels] == ["matmul", "add", "relu", "matmul", "add", "softmax_xent"]
    w, b = jnp.ones((16, 4), jnp.float32), jnp.ones((4,), jnp.float32)
    linear = jax.jit(lambda x: x @ w + b)  # a contraction with its bias epilogue
    closed = ir.trace(lambda x: linear(x) * 2.0, jax.ShapeDtypeStruct((8, 16), jnp.float32))
    # one cuBLAS-style call on the lecture's GPU model; a matmul and a loop on XLA:CPU
    assert [k.name for k in cost.estimate(closed, fused=False).kernels] == ["<lambda>", "mul"]
    assert [k.name for k in cost.estimate(closed, hw=CPU_LIKE).kernels] == ["matmul", "add+mul"]


@pytest.mark.slow
def test_loop_fusion_mirrors_xla_cpu_on_the_block():
    # XLA:CPU emits two convolutions and one loop doing BN, BN, add and relu (experiment 02)
    r = cost.estimate(_block(False), hw=CPU_LIKE)
    assert [k.name for k in r.kernels] == ["conv", "conv", "batch_norm+batch_norm+add+relu"]
    lecture = cost.estimate(_block(False), fused=True)  # adjacent runs: the BNs are split
    assert [k.name for k in lecture.kernels] == ["conv", "batch_norm", "conv",
                                                 "batch_norm+add+relu"]


def test_loop_fusion_never_makes_a_cycle():
    # a = sin(x) feeds the matmul and the add after it: a loop holding sin and add would both
    # feed the matmul and consume it, so the add gets a loop of its own (as in XLA)
    w = jnp.ones((4, 4), jnp.float32)

    def f(x):
        a = jnp.sin(x)
        return a + a @ w
    closed = ir.trace(f, jax.ShapeDtypeStruct((4, 4), jnp.float32))
    assert [len(g) for g in group(ir.op_view(closed), "loop")] == [1, 1, 1]
    g = lambda x: jnp.cos(jnp.sin(x) @ w) + jnp.exp(x)  # noqa: E731  (no cycle: exp joins)
    closed = ir.trace(g, jax.ShapeDtypeStruct((4, 4), jnp.float32))
    assert [k.name for k in cost.estimate(closed, hw=CPU_LIKE).kernels] == [
        "sin", "matmul", "cos+exp+add"]


def test_open_calls_gives_each_call_of_one_body_its_own_values():
    w = np.ones((3, 3), np.float32)
    f = jax.jit(lambda x: jnp.sin(x) @ w + 1.0)  # a matmul beside other work: not one kernel
    same = jax.jit(lambda x: x)                  # passes its input through
    closed = ir.trace(lambda x: same(f(f(x))), jax.ShapeDtypeStruct((3, 3), jnp.float32))
    view = ir.open_calls(closed, lambda e: True)
    assert [e.primitive.name for e in view.eqns] == ["sin", "dot_general", "add"] * 2
    outs = [v for e in view.eqns for v in e.outvars]
    assert len(set(outs)) == 6  # one traced body, two calls: two sets of values
    assert view.outvars[0] is view.eqns[-1].outvars[0]  # through the pass-through call
    assert view.eqns[3].invars[0] is view.eqns[2].outvars[0]  # the second call reads the first
    r = cost.estimate(closed, fused=False)
    assert [k.name for k in r.kernels] == ["sin", "matmul", "add"] * 2 + ["<lambda>"]


def test_prng_keys_cost_their_key_data():
    key = jax.random.key(0)
    assert ir.aval_bytes(jax.typeof(key)) == key.dtype.itemsize == 8
    closed = ir.trace(lambda k, x: x * jax.random.bernoulli(k, 0.5, x.shape),
                      key, jax.ShapeDtypeStruct((4, 8), jnp.float32))
    for hw in ("h100", CPU_LIKE):
        r = cost.estimate(closed, hw=hw, strict=True)  # every RNG primitive has a rule
        assert r.total_flops > 0 and r.unknown == []
    split = cost.estimate(ir.trace(lambda k: jax.random.split(k, 4), key), strict=True)
    assert split.total_bytes == 8 + 4 * 8  # one key read, four written


def test_sizes_are_python_integers_and_impossible_sizes_are_refused():
    with pytest.raises(MlsysError, match="more than any array can hold"):
        ir.parse_spec("f32[9223372036854775808]")
    big = ir.parse_spec("f32[1000000000,1000000000]")
    assert ir.aval_bytes(big) == 4 * 10 ** 18  # no int64 wrap-around
    closed = ir.trace(lambda x: x + 1, big)
    r = cost.estimate(closed)
    assert r.total_bytes == 8 * 10 ** 18 and r.kernels[0].intensity > 0


def test_static_leaves_of_modules_are_not_specs():
    m = Scaled(jnp.ones(3, jnp.float32), "batch", jnp.tanh)  # a string leaf inside a module: not a spec
    closed = ir.trace(lambda m, x: m.act(m.w * x), m, "f32[3]")
    assert [v.aval.shape for v in closed.jaxpr.invars] == [(3,), (3,)]
    assert ir.trace(lambda x, s: x * s, "f32[3]", 2.0).jaxpr.invars[1].aval.weak_type


def test_conv_bias_stays_one_kernel_on_the_lecture_model_and_splits_on_cpu():
    x = jax.ShapeDtypeStruct((1, 4, 6, 6), jnp.float32)
    w, b = np.ones((4, 4, 3, 3), np.float32), np.ones((4,), np.float32)
    closed = ir.trace(lambda x: jax.nn.relu(models.conv_bias(x, w, b)), x)
    assert [k.name for k in cost.estimate(closed).kernels] == ["conv_bias", "relu"]
    assert [k.name for k in cost.estimate(closed, hw=CPU_LIKE).kernels] == ["conv", "add+relu"]
