"""What the feature-cut tests share: float32 arithmetic and a cut taken above 64 KiB of weights, its
coverage cuts 64 KiB each (so that a small layer is validated on a cut), and seeded float32
draws."""
import jax
import jax.numpy as jnp
import pytest

from mlsys_jax.passes import feature_cut


@pytest.fixture(autouse=True)
def float32_and_a_small_cut(monkeypatch):
    monkeypatch.setattr(feature_cut, "CUT_ABOVE", 1 << 16)
    monkeypatch.setattr(feature_cut, "WINDOW_BYTES", 1 << 16)
    with jax.enable_x64(False):
        yield


def normal_f32(rng, shape, scale=1.0, offset=0.0):
    return jnp.asarray(offset + scale * rng.standard_normal(shape), jnp.float32)
