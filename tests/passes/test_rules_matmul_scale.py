"""fold_matmul_scale: a constant scale folded into the matmul with constant weights before it —
attention's ``q / √d`` on the query projection, or ``(q @ k.T) * c`` on the scores (a matmul is
linear in each operand) — on plain JAX in the three ways users write it and on a flax
``nn.MultiHeadDotProductAttention`` block with constant weights; every element within float32
rounding on fresh inputs; a scale that is not one scalar refused with the reason."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import ir, passes as P
from mlsys_jax.passes import registry

D = 8  # √8 is not a power of two: the folded weights round differently, the check is not vacuous
RNG = np.random.default_rng(0)
WQ, WK = (jnp.asarray(RNG.standard_normal((D, D)), jnp.float32) for _ in range(2))
BQ = jnp.asarray(RNG.standard_normal(D), jnp.float32)
FORMS = {
    "q_scaled": lambda q, k: (q / math.sqrt(D)) @ k.T,  # Python floats: weak, q stays float32
    "scores_scaled": lambda q, k: (q @ k.T) * (1.0 / math.sqrt(D)),
    "scores_div": lambda q, k: (q @ k.T) / jnp.sqrt(float(D)),
}


def _fold(closed):
    return P.run(P.chain(P.fold_constants(), registry.make("fold_matmul_scale"), P.dce()), closed)


def _within_rounding(closed, res, f, shape):
    for k in range(3):
        x = 2.0 * jax.random.normal(jax.random.key(10 + k), shape, jnp.float32)
        want = np.asarray(f(x), np.float64)
        got = np.asarray(ir.interpret(res.jaxpr, x)[0], np.float64)
        assert np.abs(want).max() > 0.1
        assert np.all(np.abs(got - want) <= 1e-5 * (1 + np.abs(want)))


@pytest.mark.slow  # the first of them compiles softmax's kernels: ~1.5 s
@pytest.mark.parametrize("form", FORMS)
def test_the_scale_goes_into_the_query_projection(form):
    def attend(x):
        scores = FORMS[form](x @ WQ + BQ, x @ WK)
        return jax.nn.softmax(scores, axis=-1) @ x
    closed = ir.trace(attend, jax.ShapeDtypeStruct((5, D), jnp.float32))
    res = _fold(closed)
    fired = [w for w in res.rewrites if w.rule == "fold_matmul_scale"]
    assert len(fired) == 1 and fired[0].detail.endswith("projection at 0")  # the query's, once
    before, after = ir.primitive_counts(closed.jaxpr), ir.primitive_counts(res.jaxpr)
    assert after["mul"] + after["div"] == before["mul"] + before["div"] - 1  # the scale is gone
    _within_rounding(closed, res, attend, (5, D))


def test_a_scores_scale_that_is_not_one_scalar_is_refused():
    mask = jnp.asarray(RNG.uniform(0.5, 2.0, (5, 5)), jnp.float32)  # per score, not per feature
    f = lambda x: (x @ WQ) @ (x @ WK).T * mask  # noqa: E731
    closed = ir.trace(f, jax.ShapeDtypeStruct((5, D), jnp.float32))
    res = _fold(closed)
    assert not any(w.rule == "fold_matmul_scale" for w in res.rewrites)
    assert any(r.check == "scalar_scale" for r in res.refusals), res.refusals


def test_a_batch_norm_after_the_projection_is_left_to_fold_dense_bn():
    f = lambda x: (x @ WQ) * 2.0 + BQ  # noqa: E731  a scale then a shift: a BatchNorm's shape
    res = _fold(ir.trace(f, jax.ShapeDtypeStruct((5, D), jnp.float32)))
    assert not any(w.rule == "fold_matmul_scale" for w in res.rewrites)


@pytest.mark.slow
def test_flax_attention_block_with_constant_weights():
    import flax.linen as nn

    x = jax.random.normal(jax.random.key(0), (2, 5, 16), jnp.float32)
    block = nn.MultiHeadDotProductAttention(num_heads=2, qkv_features=16)  # head size 8
    params = block.init(jax.random.key(1), x)
    f = lambda x: block.apply(params, x)  # noqa: E731
    closed = ir.trace(f, x)
    res = P.run(registry.pipeline(), closed)  # the default pipeline, validated
    fired = [w for w in res.rewrites if w.rule == "fold_matmul_scale"]
    assert len(fired) == 1 and "projection" in fired[0].detail
    assert ir.primitive_counts(res.jaxpr)["div"] < ir.primitive_counts(closed.jaxpr)["div"]
    _within_rounding(closed, res, f, x.shape)
