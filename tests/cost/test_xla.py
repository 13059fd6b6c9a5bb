"""XLA's figures beside ours: FLOPs with scan bodies per trip agree with the cost model, and the
memory figures of a program compiled on shapes equal those of the same program on arrays."""
import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import cost
from mlsys_jax.cost.xla import xla_figures


def _nested_scans(w, x):
    def layer(h, wi):
        def step(g, _):
            return jnp.tanh(g @ wi), None
        return jax.lax.scan(step, h, None, length=3)[0], None
    return jax.lax.scan(layer, x, w)[0].sum()


def test_scan_bodies_are_counted_per_trip_like_the_cost_model():
    w, x = jax.ShapeDtypeStruct((8, 32, 32), jnp.float32), jax.ShapeDtypeStruct((4, 32), jnp.float32)
    closed = jax.make_jaxpr(jax.grad(_nested_scans))(w, x)
    figures = xla_figures(closed)
    ours = cost.estimate(closed).total_flops
    matmuls = 3 * 8 * 3 * 2 * 4 * 32 * 32   # forward, and two in the backward, per trip
    assert figures.xla_flops >= matmuls      # XLA's count alone would be 1/24 of it
    assert abs(figures.xla_flops - ours) <= 0.03 * ours


def test_memory_figures_on_shapes_equal_those_on_arrays():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 32, 32)).astype(np.float32)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    on_arrays = xla_figures(jax.make_jaxpr(jax.grad(_nested_scans))(w, x))
    on_shapes = xla_figures(jax.make_jaxpr(jax.grad(_nested_scans))(
        jax.ShapeDtypeStruct(w.shape, w.dtype), jax.ShapeDtypeStruct(x.shape, x.dtype)))
    assert on_arrays == on_shapes
    assert on_shapes.xla_argument_bytes == w.nbytes + x.nbytes
