"""fold_scale_into_dense: an RMSNorm's per-feature scale before a Dense layer goes into the
weights' rows, with the same outputs; scales that are not one factor per contracted feature, and
scaled values read elsewhere, are refused with the reason."""
import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import ir
from mlsys_jax import passes as P
from mlsys_jax.compat import jaxpr_as_fun

RNG = np.random.default_rng(0)
GAMMA = np.linspace(0.5, 2.0, 16).astype(np.float32)
W = RNG.standard_normal((16, 8)).astype(np.float32)


def rms_norm(x):
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6)


def _run(f, spec="f32[4,16]"):
    closed = ir.trace(f, spec)
    return closed, P.run(P.fold_scale_into_dense(), closed)


def _outputs(closed, x):
    return np.asarray(jaxpr_as_fun(closed)(x)[0])


def test_the_scale_moves_into_the_rows_and_the_outputs_stay():
    closed, r = _run(lambda x: (rms_norm(x) * GAMMA) @ W)
    assert r.changed and len(r.rewrites) == 1
    counts = ir.primitive_counts(r.jaxpr)
    assert counts["mul"] == ir.primitive_counts(closed)["mul"] - 1
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(_outputs(r.jaxpr, x), _outputs(closed, x), rtol=1e-5, atol=1e-5)


def test_weights_on_the_left_and_a_transposed_contraction_fold_too():
    def f(x):  # W.T @ (n·γ).T: the weights are the lhs, x contracted on its axis 1
        return jax.lax.dot_general(W.T, rms_norm(x) * GAMMA, (((1,), (1,)), ((), ())))
    closed, r = _run(f)
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    assert r.changed
    np.testing.assert_allclose(_outputs(r.jaxpr, x), _outputs(closed, x), rtol=1e-5, atol=1e-5)


def test_a_scale_along_the_kept_rows_is_refused():
    rows = np.linspace(1, 2, 4).astype(np.float32)[:, None]
    _, r = _run(lambda x: (rms_norm(x) * rows) @ W)
    assert not r.changed and r.refusals[0].check == "per_feature"


def test_a_scaled_value_read_elsewhere_is_refused():
    def f(x):
        y = rms_norm(x) * GAMMA
        return (y @ W).sum() + y.sum()
    _, r = _run(f)
    assert not r.changed and r.refusals[0].check == "single_use"
