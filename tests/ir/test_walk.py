"""One primitive table, one walk and path format, one structural key (mlsys_jax.ir)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax import ir, passes
from mlsys_jax.ir import evaluate, keys, primitives as P


@jax.jit
def block(x):
    return jnp.sin(x) * jnp.sin(x)  # CSE merges the second sin


def nested(x, i):
    """CSE targets inside jit[block] (also nested in a cond branch) and a scan body."""
    y = block(x)
    y = lax.cond(i > 0, lambda a: block(a) + jnp.cos(a) * jnp.cos(a), lambda a: a, y)
    c, ys = lax.scan(lambda c, xi: (c + jnp.exp(xi) + jnp.exp(xi), c), 0.0, y)
    return c + ys.sum()


def test_a_rewrite_in_a_body_names_the_walk_path_of_the_rewritten_equation():
    closed = ir.trace(nested, "f32[3]", "i32[]")
    eqns = dict(ir.walk(closed))
    res = passes.cse()(closed)
    assert res.changed
    wheres = [r.where for r in res.rewrites]
    assert {w.split("/")[1] for w in wheres} == {"jit[block]", "cond.branches[1]", "scan.jaxpr"}
    assert any("/cond.branches[1]/" in w and "/jit[block]/" in w for w in wheres)  # two levels
    for r in res.rewrites:
        dup, first = eqns[r.where], eqns[r.detail.split("= equation ")[1]]
        assert dup is not first and dup.primitive is first.primitive and dup.invars == first.invars
        assert r.detail.startswith(dup.primitive.name)


def test_inline_names_nested_calls_by_their_walk_path():
    @jax.jit
    def inner(x):
        return jnp.sin(x)

    @jax.jit
    def outer(x):
        return inner(x) * 2.0

    closed = ir.trace(lambda x: outer(x) + 1.0, "f32[3]")
    eqns = dict(ir.walk(closed))
    res = passes.inline()(closed)
    assert [r.where for r in res.rewrites] == ["0", "0/jit[outer]/0"]
    assert [ir.op_name(eqns[r.where]) for r in res.rewrites] == ["outer", "inner"]


def test_bodies_label_named_calls_by_name_and_control_flow_by_param():
    closed = ir.trace(nested, "f32[3]", "i32[]")
    labels = [b.label for eqn in closed.jaxpr.eqns for b in ir.bodies(eqn)]
    assert labels == ["jit[block]", "cond.branches[0]", "cond.branches[1]", "scan.jaxpr"]
    assert all(b.is_closed for eqn in closed.jaxpr.eqns for b in ir.bodies(eqn))


def _sin_with_derivative_scale(scale):
    @jax.custom_jvp
    def g(x):
        return jnp.sin(x)

    g.defjvp(lambda p, t: (g(p[0]), t[0] * scale))
    return g


def test_cse_keeps_custom_jvp_calls_whose_rules_differ():
    # Same body, different derivative rules: merging them would make the gradient 2, not 3.
    g1, g2 = _sin_with_derivative_scale(1.0), _sin_with_derivative_scale(2.0)
    closed = ir.trace(lambda x: g1(x) + g2(x), "f32[]")
    res = passes.cse()(closed)
    assert not res.changed
    assert jax.grad(lambda x: ir.as_function(res.jaxpr)(x)[0])(np.float32(1.0)) == 3.0
    # The graph's identity survives a re-trace, which makes new rule objects.
    assert ir.structural_hash(ir.rebuild(closed)) == ir.structural_hash(closed)
    assert keys.params_key(closed.jaxpr.eqns[0].params, strict=False) == \
        keys.params_key(closed.jaxpr.eqns[1].params, strict=False)


def test_cse_still_merges_two_calls_of_one_traced_body():
    relu_block = jax.jit(lambda x: jax.nn.relu(x) * 2.0)  # a custom_jvp rule inside the body
    closed = ir.trace(lambda x: relu_block(x) + relu_block(x), "f32[3]")
    res = passes.cse()(closed)
    assert [r.where for r in res.rewrites] == ["1"]


def test_literals_are_keyed_by_value_at_their_dtype():
    f32 = jax.ShapeDtypeStruct((), jnp.float32)
    assert keys.value_key(2.0, f32) == keys.value_key(np.float32(2.0), f32)
    assert keys.value_key(0.0, f32) != keys.value_key(-0.0, f32)
    weak = jax.ShapeDtypeStruct((), jnp.float32, weak_type=True)
    assert keys.value_key(2.0, weak) != keys.value_key(2.0, f32)


def test_signature_sees_weak_types():
    strong = ir.trace(lambda x: x * 2, jax.ShapeDtypeStruct((), jnp.float32))
    weak = ir.trace(lambda x: x * 2, jax.ShapeDtypeStruct((), jnp.float32, weak_type=True))
    assert ir.signature(strong) == [[((), "float32", False)], [((), "float32", False)]]
    assert ir.signature(weak) != ir.signature(strong)


def test_the_op_by_op_evaluator_runs_every_body():
    x = np.linspace(-1, 1, 3, dtype=np.float32)
    for i in (0, 1):
        closed = ir.trace(nested, x, np.int32(i))
        (got,) = evaluate.evaluate(closed, x, np.int32(i))
        np.testing.assert_allclose(got, nested(x, np.int32(i)), rtol=1e-6)
    loop = ir.trace(lambda v: lax.while_loop(lambda c: c < 10.0, lambda c: c * 2.0, v), "f32[]")
    assert evaluate.evaluate(loop, np.float32(1.5))[0] == 12.0


def test_the_primitive_classes_nest_as_the_modules_assume():
    assert P.SHAPE_ONLY <= P.LOCAL_MOVEMENT and P.JIT <= P.PLAIN_CALLS
    assert P.PLAIN_CALLS <= P.NAMED_CALLS <= P.TRANSPARENT_CALLS <= P.CALLS
    opaque = P.COLLECTIVE_MOVES | P.COLLECTIVE_REDUCTIONS | P.PLACEMENT | P.RNG_KEYS | P.RNG_BITS
    assert not P.PURE & (opaque | P.FREE | P.CALLS | P.CONTROL)
    assert not P.CALLS & P.CONTROL and not P.CONTRACTIONS & (P.ELEMENTWISE | P.MOVEMENT)
