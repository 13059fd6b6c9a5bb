"""A loss that is NaN on one device at the initial parameters is refused in one line that names
where the first non-finite value appears (never "nan > bound nan"), on the mesh and the pipeline."""
import jax
import jax.numpy as jnp
import optax
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import ShardOptions, simulate
from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline


def loss(p, b):
    h = jnp.tanh(b["x"] @ p["w1"])
    return jnp.mean(jnp.log(h @ p["w2"]))          # log of negatives: NaN


def _inputs():
    return ({"w1": jnp.ones((4, 4), jnp.float32), "w2": -jnp.ones((4, 2), jnp.float32)},
            {"x": jnp.ones((8, 4), jnp.float32)})


@pytest.mark.slow
def test_the_mesh_names_the_equation_that_makes_the_nan():
    params, batch = _inputs()
    with jax.enable_x64(False), pytest.raises(MlsysError, match=r"the loss is nan .* first "
                                                                  r"appears at log at "
                                                                  r"test_nonfinite\.py:15"):
        simulate(loss, params, batch, optax.sgd(0.1), {"data": 2},
                 ShardOptions(steps=1, time_repeats=0))


@pytest.mark.slow
def test_the_pipeline_refuses_it_too():
    params, batch = _inputs()
    with jax.enable_x64(False):
        plan = plan_pipeline(loss, params, batch, optax.sgd(0.1), {"pipe": 2}, 2, hw="h100")
        with pytest.raises(MlsysError, match="first appears at log"):
            run_pipeline(plan, 1)
