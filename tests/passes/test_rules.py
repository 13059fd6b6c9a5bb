"""The rule engine (passes/rules/): a rule is one module, registered with one line; the semantic view
of linear ops (which output axes a conv's or a dot_general's weights own) and the dataflow proof
that an operand runs along them."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir, passes as P
from mlsys_jax.compat import Literal
from mlsys_jax.passes import registry
from mlsys_jax.passes.rewrite import linear
from mlsys_jax.passes.rewrite.axes import moved_axes, provenance
from mlsys_jax.passes.rewrite.level import Level
from mlsys_jax.passes.rewrite.rule import STRUCTURAL, Match, Precondition, Refused, Rule
from mlsys_jax.passes.search import search


# ---- a rule written as docs/architecture.md "Adding a rule" says --------------------------------

def _times_one(level):
    """Anchor: x · 1 (a literal one) with x the other operand."""
    for i, e in enumerate(level.eqns):
        ones = [v for v in e.invars if type(v) is Literal and np.all(np.asarray(v.val) == 1)]
        if e.primitive.name == "mul" and len(ones) == 1:
            if e.outvars[0].aval.dtype != next(v for v in e.invars if v is not ones[0]).aval.dtype:
                yield Refused(i, "same_dtype", "x · 1 changes the dtype here")
                continue
            yield Match(anchor=i, eqns=(i,), outputs=(e.outvars[0],), detail="x · 1 → x")


def _the_other_operand(m, em):
    eqn = em.level.eqns[m.anchor]
    (x,) = [v for v in eqn.invars if type(v) is not Literal]
    return {m.outputs[0]: em.value(x)}


def _not_an_output(m, level):
    return "the product is an output" if -1 in level.users.get(m.outputs[0], []) else None


def _times_one_module():
    rule = Rule(name="drop_times_one", what="x · 1 is x", match=_times_one,
                emit=_the_other_operand, checks=(Precondition("not_an_output", _not_an_output),),
                kind=STRUCTURAL, primitives=frozenset({"mul"}))

    def drop_times_one(only=None):
        return rule.make_pass(only)
    return SimpleNamespace(RULE=rule, drop_times_one=drop_times_one)


def test_a_rule_registered_as_the_docs_say_is_a_pass_and_a_search_move():
    closed = ir.trace(lambda x: (jnp.sin(x * 1.0) * 1.0 + 2.0, x * 1.0), jnp.ones(5))
    module = _times_one_module()
    with registry.registered(module) as entry:
        assert entry.name in registry.search_moves() and entry.kind == STRUCTURAL
        res = P.run(registry.make("drop_times_one"), closed)  # verified and validated
        assert len(res.rewrites) == 2 and res.refusals[0].check == "not_an_output"
        found = search(closed, rules=["drop_times_one"], pipeline=None, hw="h100", dtype=None)
        assert [s.rule for s in found.path] == ["drop_times_one"] * 2
        assert found.best_cost["kernels"] < found.start["kernels"]
        x = jnp.linspace(-2, 2, 5)
        for a, b in zip(ir.interpret(closed, x), ir.interpret(found.best, x)):
            assert np.array_equal(a, b)
    assert "drop_times_one" not in registry.PASSES  # the with block took it away again
    with pytest.raises(Exception, match="registered already"):
        registry.register(registry.entry("dce"))


def test_the_pass_value_holds_only_what_is_read():
    assert [f.name for f in dataclasses.fields(P.Pass)] == ["name", "fn", "composite"]
    assert not P.dce().composite and P.chain(P.dce()).composite and P.fixpoint(P.dce()).composite
    assert {e.kind for e in registry.PASSES.values()} == {registry.STRUCTURAL, registry.NUMERIC}


# ---- the semantic view of linear ops -------------------------------------------------------------

@pytest.mark.parametrize("layout", [("NCHW", "OIHW", "NCHW"), ("NHWC", "HWIO", "NHWC"),
                                    ("NCHW", "HWIO", "NHWC")])
def test_a_convs_weights_own_its_output_feature_axis(layout):
    w = jnp.ones((3, 3, 4, 6) if layout[1] == "HWIO" else (6, 4, 3, 3), jnp.float32)
    x = jax.ShapeDtypeStruct((2, 4, 5, 5) if layout[0] == "NCHW" else (2, 5, 5, 4), jnp.float32)
    closed = ir.trace(lambda x: lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                         dimension_numbers=layout), x)
    (site,) = linear.convs(closed.jaxpr)
    assert site.features == (layout[2].index("C"),)
    assert site.weight_axes == (layout[1].index("O"),)
    assert site.feature_shape == (6,) and site.out_features == 6


def test_a_dot_generals_weights_own_their_free_and_batch_axes():
    x = jax.ShapeDtypeStruct((7, 3, 4), jnp.float32)
    w = jnp.ones((7, 4, 2, 5), jnp.float32)  # batch 7, contract 4, free (2, 5): like a batched DenseGeneral
    closed = ir.trace(lambda x: lax.dot_general(x, w, (((2,), (1,)), ((0,), (0,)))), x)
    level = Level(closed)
    (site,) = linear.dots(closed.jaxpr, level.known)
    assert site.features == (0, 2, 3) and site.weight_axes == (0, 2, 3)
    flipped = ir.trace(lambda v: lax.dot_general(jnp.ones((6, 3), jnp.float32), v,
                                                 (((1,), (1,)), ((), ()))),
                       jax.ShapeDtypeStruct((4, 3), jnp.float32))  # equinox: W @ x, W first
    (site,) = linear.dots(flipped.jaxpr, Level(flipped).known)
    assert site.features == (0,) and site.weight_axes == (0,) and site.x is flipped.jaxpr.invars[0]


def test_scaling_the_output_is_scaling_the_weights_along_their_axes():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((4, 2, 5)))
    x = jnp.asarray(rng.standard_normal((3, 4)))
    closed = ir.trace(lambda x: lax.dot_general(x, w, (((1,), (0,)), ((), ()))), x)
    (site,) = linear.dots(closed.jaxpr, Level(closed).known)
    vec = rng.standard_normal((2, 5))
    scaled = linear.scale_weights(np.asarray(w), vec, site, np.float64)
    want = np.einsum("bk,kij->bij", np.asarray(x), np.asarray(w)) * vec
    np.testing.assert_allclose(np.einsum("bk,kij->bij", np.asarray(x), scaled), want, rtol=1e-12)



def test_a_large_kernel_is_scaled_a_block_at_a_time_and_its_overflow_found_per_feature(
        monkeypatch):
    """Scaled in blocks (an HWIO kernel: along its input features, past the 1×1 window axes), the
    weights are what scaling the whole kernel in float64 gives; the overflow check, from each
    feature's largest weight, counts the Infs that scaling would make (and none for an Inf or NaN
    the kernel had)."""
    monkeypatch.setattr(linear, "_SCALE_BLOCK_BYTES", 256)
    w = (np.random.default_rng(0).standard_normal((1, 1, 8, 6)) * 100).astype(np.float16)
    w[0, 0, 3, 2], w[0, 0, 1, 4] = np.inf, np.nan
    closed = ir.trace(lambda x: lax.conv_general_dilated(
        x, jnp.asarray(w), (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        jax.ShapeDtypeStruct((1, 2, 2, 8), jnp.float16))
    level = Level(closed)
    (site,) = linear.convs(closed.jaxpr)
    vec = np.array([1.0, 700.0, 2.0, 1.0, 3.0, 1e-3])
    with np.errstate(over="ignore"):
        want = (w.astype(np.float64) * vec).astype(np.float16)
    got = linear.scale_weights(w, vec, site, np.float16)
    np.testing.assert_array_equal(got, want)
    assert got.ctypes.data % 64 == 0  # aligned: a compiled program reads it in place
    new = int((np.isfinite(w) & ~np.isfinite(want)).sum())
    assert new > 0 and f"{new} of {w.size} are Inf" in linear.weights_overflow(level, site, vec)
    assert linear.weights_overflow(level, site, np.ones(6)) is None

# ---- per feature, proved from the dataflow -------------------------------------------------------

def test_provenance_follows_broadcasts_to_the_axes_an_operand_varies_along():
    b = jnp.arange(4.0, dtype=jnp.float32)

    def f(x):
        return x + b[None, None, :, None], x + b[None, :, None, None], x * 2.0
    closed = ir.trace(f, jax.ShapeDtypeStruct((2, 4, 4, 4), jnp.float32))
    level = Level(closed)
    adds = [e for e in closed.jaxpr.eqns if e.primitive.name == "add"]
    along_h, along_c = (provenance(level.producer, e.invars[1]) for e in adds)
    assert along_h.varies_along() == {2} and along_c.varies_along() == {1}
    assert along_h.source is along_c.source  # the same vector b, on two axes


def test_moves_track_the_feature_axes():
    closed = ir.trace(lambda z: (z.transpose(0, 2, 3, 1), z.reshape(2, 1, 4, 9), z.reshape(8, 9)),
                      jax.ShapeDtypeStruct((2, 4, 3, 3), jnp.float32))
    t, r, merged = closed.jaxpr.eqns[:3]
    assert moved_axes(t, (2, 4, 3, 3), (1,)) == (3,)
    assert moved_axes(r, (2, 4, 3, 3), (1,)) == (2,)
    assert moved_axes(merged, (2, 4, 3, 3), (1,)) is None  # channels mixed with the batch
