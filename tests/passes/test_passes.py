"""Structural passes (dce, cse, fold_constants, inline) and the pass manager (docs/verification.md §1, §3, §5)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive

from mlsys_jax import ir, models, passes as P
from mlsys_jax.errors import MlsysError
from mlsys_jax.passes.verify import VerificationError, effect_multiset, signature

F32 = jnp.float32
C4 = jnp.arange(4.0, dtype=F32)

# An opaque user primitive: passes must neither fold nor merge it (docs/verification.md §5).
opaque_p = Primitive("opaque_double")
opaque_p.def_impl(lambda x: x * 2)
opaque_p.def_abstract_eval(lambda x: x)


@jax.custom_jvp
def cj_sin(x):
    return jnp.sin(x)


cj_sin.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@jax.custom_vjp
def cv_sq(x):
    return x * x


cv_sq.defvjp(lambda x: (x * x, x), lambda x, g: (2 * x * g,))


def prog_jit(x):
    dead = jnp.exp(x) * 3.0  # noqa: F841  (dead code for DCE)
    a, b = x * 2.0, x * 2.0
    y = jax.jit(lambda u: u * C4 + (u * C4))(a + b + (C4 * 2.0 + 1.0))
    return jax.jit(lambda u: jax.jit(lambda v: v - 1.0)(u) * 2.0)(y), x * 3.0


def prog_cond(x):
    return lax.cond(x[0] > 0, lambda a: a * (C4 * 2.0) + a * (C4 * 2.0), lambda a: a - C4, x)


def prog_scan(x):
    s, ys = lax.scan(lambda c, a: (c + a * (C4 * 3.0), jnp.sin(c) + jnp.sin(c)), x,
                     jnp.ones((3, 4), F32))
    return s, ys


def prog_while(x):
    return lax.while_loop(lambda v: v[0] < 10.0, lambda v: v + C4 + 1.0 + (C4 * 0.5), x)


def prog_checkpoint(x):
    f = jax.checkpoint(lambda v: jnp.sin(v) + jnp.sin(v) + (C4 * 2.0))
    return f(x) + f(x)


def prog_custom(x):
    return cj_sin(x) + cj_sin(x) + cv_sq(x) + cv_sq(x)


def prog_print(x):
    y = x * 2.0
    jax.debug.print("y0={}", y[0])
    jax.debug.print("y0={}", y[0])  # two identical prints: both must stay
    return y + (C4 * 2.0)


def prog_opaque(x):
    k = opaque_p.bind(C4)
    return opaque_p.bind(x) + opaque_p.bind(x) + k


def prog_weak(x):
    return x + 1.0, jnp.sin(2.0) * 3.0  # the second output is a weak-typed constant


PROGRAMS = {"jit": prog_jit, "cond": prog_cond, "scan": prog_scan, "while": prog_while,
            "checkpoint": prog_checkpoint, "custom": prog_custom, "print": prog_print,
            "opaque": prog_opaque, "weak": prog_weak}
X = jnp.array([0.5, -1.0, 2.0, 3.0], F32)
STRUCTURAL = {"dce": P.dce, "cse": P.cse}  # bitwise tier (docs/verification.md §3)
# inline: XLA compiles a call as a unit (it may contract z*s + t into an FMA), so inlined
# primitives can round differently: the numeric tier applies.
ALL = {**STRUCTURAL, "inline": P.inline, "fold_constants": P.fold_constants,
       "pipeline": lambda: P.chain(P.inline(), P.fold_constants(), P.cse(), P.dce())}


def _outs(closed):
    return [np.asarray(o) for o in ir.interpret(closed, X)]  # op by op (eager), docs/verification.md §3


@pytest.mark.slow
@pytest.mark.parametrize("prog", sorted(PROGRAMS))
@pytest.mark.parametrize("name", sorted(ALL))
def test_pass_keeps_results_types_effects_and_is_idempotent(prog, name):
    closed = ir.trace(PROGRAMS[prog], X)
    h0 = ir.structural_hash(closed)
    res = P.run(ALL[name](), closed, cost=False)
    assert ir.structural_hash(closed) == h0  # input not mutated
    new = res.jaxpr
    assert signature(new) == signature(closed)  # shapes, dtypes, weak_type
    assert effect_multiset(new) == effect_multiset(closed)
    for a, b in zip(_outs(closed), _outs(new)):
        assert a.dtype == b.dtype and a.shape == b.shape
        if name in STRUCTURAL:
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=1.3e-6, atol=1e-5)
    again = P.run(ALL[name](), new, cost=False)
    assert not again.changed, [r.detail for r in again.rewrites]


def test_each_pass_fires_where_expected():
    closed = ir.trace(prog_jit, X)
    assert P.run(P.dce(), closed).changed
    assert any("mul" in r.detail for r in P.run(P.cse(), closed).rewrites)
    assert P.run(P.fold_constants(), closed).changed
    inl = P.run(P.inline(), closed).jaxpr
    assert ir.primitive_counts(inl)["jit"] == 0


def test_opaque_primitive_is_never_folded_or_merged():
    closed = ir.trace(prog_opaque, X)
    new = P.run(P.chain(P.fold_constants(), P.cse(), P.dce()), closed).jaxpr
    assert ir.primitive_counts(new)["opaque_double"] == 3


def test_cse_keys_params_and_literal_types():
    def f(x):
        return lax.reduce_sum(x, (0,)) + lax.reduce_max(x, (0,)), jnp.sum(x, 0), jnp.sum(x, 1)
    x = jnp.ones((3, 4), F32)
    new = P.run(P.cse(), ir.trace(f, x)).jaxpr
    assert ir.primitive_counts(new)["reduce_sum"] == 2  # sum over axis 0 vs 1: params differ
    g = lambda x: (x + 1.0, x + 2.0, x + 1.0)  # literals keyed by value
    assert ir.primitive_counts(P.run(P.cse(), ir.trace(g, X)).jaxpr)["add"] == 2
    h = lambda s: (s * 2.0, s * jnp.float32(2.0))  # weak vs strong literal on a weak scalar
    weak = jax.ShapeDtypeStruct((), F32, weak_type=True)
    closed = ir.trace(h, weak)
    new = P.run(P.cse(), closed).jaxpr
    assert signature(new) == signature(closed)


def test_param_blind_cse_is_caught_by_results():
    def f(x):
        return jnp.sum(x, 0), jnp.sum(x, 1)
    x = jnp.arange(12.0, dtype=F32).reshape(3, 4)
    closed = ir.trace(f, x)
    broken = P.cse(param_blind=True)
    with pytest.raises(VerificationError):  # the verifier sees the changed signature...
        P.run(broken, closed)


def test_cse_never_merges_effects_or_remat():
    closed = ir.trace(prog_print, X)
    assert ir.primitive_counts(P.run(P.cse(), closed).jaxpr)["debug_print"] == 2
    new = P.run(P.cse(), ir.trace(prog_checkpoint, X)).jaxpr
    assert ir.primitive_counts(new, recursive=False)["remat2"] == 2


def test_fold_constants_never_expands_zero_input_producers():
    def f(x):
        return x + jnp.zeros((64, 64), F32) + lax.iota(F32, 64)
    closed = ir.trace(f, jnp.ones((64, 64), F32))
    new = P.run(P.fold_constants(), closed).jaxpr
    assert all(np.size(c) <= 1024 for c in new.consts)


def test_verifier_catches_weak_type_and_dropped_effects():
    closed = ir.trace(prog_weak, X)
    with pytest.raises(VerificationError, match="signature"):
        P.run(P.fold_constants(keep_weak=False), closed)

    def drop_prints(c):
        def strip(eqn, invals):
            return [] if eqn.primitive.name == "debug_print" else None
        return P.PassResult(ir.rebuild(c, strip), True)
    with pytest.raises(VerificationError, match="effect"):
        P.run(P.make_pass("drop_prints", drop_prints), ir.trace(prog_print, X))


def test_verifier_catches_dishonest_and_mutating_passes():
    closed = ir.trace(prog_jit, X)
    liar = P.make_pass("liar", lambda c: P.PassResult(P.dce_jaxpr(c), False))
    with pytest.raises(VerificationError, match="unchanged"):
        P.run(liar, closed)


def test_fixpoint_is_bounded_and_detects_cycles():
    closed = ir.trace(prog_jit, X)
    res = P.run(P.fixpoint(P.chain(P.fold_constants(), P.cse(), P.dce())), closed)
    assert res.changed
    flip = {"n": 0}

    def toggler(c):  # alternates between two graphs: a cycle
        flip["n"] += 1
        return P.PassResult(P.dce_jaxpr(c) if flip["n"] % 2 else closed, True)
    with pytest.raises(P.FixpointError):
        P.run(P.fixpoint(P.make_pass("toggle", toggler), max_iter=6), closed, verify=False)


def test_run_logs_cost_and_rejects_bad_input():
    res = P.run(P.dce(), ir.trace(prog_jit, X))
    entry = res.log[0]
    assert entry.cost_before["kernels"] >= entry.cost_after["kernels"]
    with pytest.raises(MlsysError, match="ClosedJaxpr"):
        P.run(P.dce(), prog_jit)
    with pytest.raises(MlsysError, match="Pass"):
        P.run(prog_jit, ir.trace(prog_jit, X))


def test_gradients_unchanged_by_pipeline():
    closed = ir.trace(lambda x: jnp.sum(prog_custom(x)), X)
    new = P.run(ALL["pipeline"](), closed).jaxpr
    g0 = jax.grad(lambda x: ir.interpret(closed, x)[0])(X)
    g1 = jax.grad(lambda x: ir.interpret(new, x)[0])(X)
    # CSE turns f(x) + f(x) into y + y: the cotangents then add in another order (1 ulp).
    np.testing.assert_allclose(g0, g1, rtol=1.3e-6, atol=1e-5)


def test_prune_outputs_is_partial_execution():
    closed = ir.trace(prog_jit, X)
    only_second = P.prune_outputs(closed, [1])
    assert len(only_second.jaxpr.outvars) == 1
    assert ir.primitive_counts(only_second)["jit"] == 0
    np.testing.assert_array_equal(ir.interpret(only_second, X)[0], X * 3.0)


def _model_programs():
    rng = np.random.default_rng(0)
    mlp = {"W1": jnp.asarray(rng.standard_normal((16, 8)) / 4, F32), "b1": jnp.zeros(8, F32),
           "W2": jnp.asarray(rng.standard_normal((8, 4)) / 3, F32), "b2": jnp.zeros(4, F32)}
    x = jnp.asarray(rng.standard_normal((5, 16)), F32)
    y = jax.nn.one_hot(jnp.arange(5) % 4, 4, dtype=F32)
    c = 4
    bn = lambda: {k: jnp.asarray(v, F32) for k, v in (  # noqa: E731
        ("gamma", 1 + 0.1 * rng.standard_normal(c)), ("beta", 0.1 * rng.standard_normal(c)),
        ("mean", 0.1 * rng.standard_normal(c)), ("var", 1 + 0.1 * rng.random(c)))}
    block = {"w3": jnp.asarray(rng.standard_normal((c, c, 3, 3)) / 6, F32),
             "w1": jnp.asarray(rng.standard_normal((c, c, 1, 1)) / 2, F32), "bn3": bn(), "bn1": bn()}
    xb = jnp.asarray(rng.standard_normal((2, c, 6, 6)), F32)
    return {"mlp_loss": (lambda x, y: models.mlp_loss(mlp, x, y), (x, y)),
            "mlp_grad": (jax.grad(lambda p, x, y: models.mlp_loss(p, x, y)), (mlp, x, y)),
            "resnet_block": (lambda x: models.resnet_block(block, x), (xb,))}


CONV_PASSES = {"fold_conv_bn": P.fold_conv_bn, "merge_parallel_convs": P.merge_parallel_convs,
               "enlarge_conv_kernel": P.enlarge_conv_kernel}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted({**ALL, **CONV_PASSES}))
def test_every_pass_on_the_project_models(name):
    for label, (fn, args) in _model_programs().items():
        closed = ir.trace(fn, *args)
        flat = jax.tree_util.tree_leaves(args)
        res = P.run({**ALL, **CONV_PASSES}[name](), closed, cost=False)
        assert signature(res.jaxpr) == signature(closed), label
        for a, b in zip(ir.interpret(closed, *flat), ir.interpret(res.jaxpr, *flat)):
            if name in STRUCTURAL:
                np.testing.assert_array_equal(a, b, err_msg=label)
            else:
                np.testing.assert_allclose(a, b, rtol=1.3e-6, atol=1e-5, err_msg=label)
        assert not P.run({**ALL, **CONV_PASSES}[name](), res.jaxpr, cost=False).changed, label


def test_nan_unsafe_algebra_is_left_alone():
    f = lambda x: (x * 0.0, x - x, x / x)  # noqa: E731  — not 0, 0, 1 when x is inf or nan
    closed = ir.trace(f, X)
    new = P.run(ALL["pipeline"](), closed).jaxpr
    bad = jnp.array([jnp.inf, jnp.nan, 0.0, 1.0], F32)
    for a, b in zip(ir.interpret(closed, bad), ir.interpret(new, bad)):
        np.testing.assert_array_equal(a, b)


def test_symbolic_shapes_are_refused():
    (b,) = jax.export.symbolic_shape("b")
    closed = jax.make_jaxpr(lambda x: x * 2.0)(jax.ShapeDtypeStruct((b, 4), F32))
    with pytest.raises(MlsysError, match="symbolic"):
        P.run(P.dce(), closed)


def test_typed_literals_fold():
    """JAX 0.10 makes ``lax.stop_gradient(0.1)`` a TypedFloat literal (no ``.shape``): what
    equinox's Dropout emits. Folding it keeps its dtype and weak type."""
    from jax.extend.core import Literal

    closed = ir.trace(lambda x: x / (1 - lax.stop_gradient(0.1)) + lax.stop_gradient(2),
                      jnp.ones(3, F32))
    assert any(type(v) is Literal and not hasattr(v.val, "shape")  # a TypedFloat, a TypedInt
               for e in closed.jaxpr.eqns for v in e.invars)
    res = P.run(P.fold_constants(), closed)
    assert res.changed and ir.primitive_counts(res.jaxpr)["stop_gradient"] == 0
    assert signature(res.jaxpr) == signature(closed)
    np.testing.assert_array_equal(ir.interpret(res.jaxpr, X[:3])[0],
                                  ir.interpret(closed, X[:3])[0])


def test_inline_then_fold_reaches_a_fixpoint():
    """fold_conv_bn emits a conv_bias call; inline leaves such a call closed (every conv rule
    reads through it), so the pair converges instead of opening and remaking it for ever."""
    w = jnp.asarray(np.random.default_rng(0).standard_normal((4, 4, 3, 3)), F32)
    bn = {k: jnp.asarray(v, F32) for k, v in dict(
        gamma=[1.0, 2.0, 0.5, 1.5], beta=[0.1, 0.2, 0.3, 0.4], mean=[0.0, 0.1, -0.1, 0.2],
        var=[1.0, 2.0, 0.5, 1.0]).items()}
    closed = ir.trace(lambda x: models.batch_norm(models.conv(x, w, 1), **bn),
                      jax.ShapeDtypeStruct((2, 4, 6, 6), F32))
    res = P.run(P.fixpoint(P.chain(P.inline(), P.fold_conv_bn())), closed)
    assert [op.name for op in ir.op_view(res.jaxpr)] == ["conv_bias"]
    assert not P.inline()(res.jaxpr).changed
    assert P.inline("conv_bias")(res.jaxpr).changed  # named, it is inlined


def test_fold_constants_refuses_what_depends_on_flushing_subnormals():
    """XLA:CPU's kernels read subnormals as zero, its constant folder does not: log of a
    subnormal constant is -103.28 under jax.jit, -103.97 through the kernel. Left unfolded."""
    c = jnp.asarray([np.float32(1e-45), 2.0], F32)
    tiny = jnp.asarray([1e-30, 1.0], F32)
    closed = ir.trace(lambda x: (x + jnp.log(c), x + tiny * 1e-10, x + c.reshape(2)),
                      jnp.ones(2, F32))
    res = P.run(P.fold_constants(), closed)
    why = [r for r in res.refusals if r.check == "computed_as_xla_computes"]
    assert [r.where for r in why] == ["0", "2"]  # log of it, and a product the kernel flushes
    assert "subnormal" in why[0].reason and "subnormal result" in why[1].reason
    assert ir.primitive_counts(res.jaxpr)["log"] == 1  # the reshape moved its bits: folded
