"""Where an equation came from (ir/provenance.py): name stacks without transforms, weights by
their pytree path, class scopes, neighbours on the same line, trace order, the user's line; and
open_calls giving an inlined body the call's names."""
import jax
import jax.numpy as jnp
import pytest

from mlsys_jax import ir
from mlsys_jax.ir import provenance as pv
from mlsys_jax.ir.opview import open_calls

X = jax.ShapeDtypeStruct((4, 8), jnp.float32)


def _origins(closed, weights=None):
    view = open_calls(closed, lambda e: True)
    return [(e.primitive.name, o) for e, o in zip(view.eqns, pv.origins(list(view.eqns),
                                                                         weights or {}))]


def test_named_scopes_nest_and_transforms_are_left_out():
    def f(x):
        with jax.named_scope("model"):
            with jax.named_scope("block0"):
                x = jnp.sin(x)
            with jax.named_scope("head"):
                return jnp.sum(x * 2.0)
    forward = {o.module for _, o in _origins(ir.trace(f, X))}
    assert forward == {("model", "block0"), ("model", "head")}
    backward = _origins(ir.trace(jax.grad(f), X))  # jvp(...) and transpose(...) wrap the names
    assert {o.module for _, o in backward} == forward
    assert {o.how for _, o in backward} == {"name"}


def test_a_jitted_call_inside_a_scope_gives_its_body_the_scope():
    inner = jax.jit(lambda x: jnp.tanh(x) + 1.0)

    def f(x):
        with jax.named_scope("outer"):
            return inner(x)
    closed = ir.trace(f, X)
    assert pv.scopes(closed.jaxpr.eqns[0]) == ("outer",)  # the call, kept whole
    view = open_calls(closed, lambda e: True)
    assert [e.primitive.name for e in view.eqns] == ["tanh", "add"]
    assert all(pv.scopes(e) == ("outer",) for e in view.eqns)
    assert view.paths == ("0/jit[<lambda>]/0", "0/jit[<lambda>]/1")


def test_weights_name_modules_by_pytree_path_through_views_of_them():
    params = {"encoder": {"w": jnp.ones((8, 8))}, "decoder": {"w": jnp.ones((8, 3))}}

    def f(p, x):
        h = jax.nn.relu(x @ p["encoder"]["w"].T)  # a transpose of the weight is still it
        return h @ p["decoder"]["w"]
    closed = ir.trace(f, params, X)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    weights = {v: pv.leaf_module(path) for v, (path, _) in zip(closed.jaxpr.invars, leaves)}
    assert set(weights.values()) == {("encoder",), ("decoder",)}
    dots = [o for name, o in _origins(closed, weights) if name == "dot_general"]
    assert [(o.module, o.how) for o in dots] == [(("encoder",), "weight"),
                                                 (("decoder",), "weight")]


@pytest.mark.parametrize("path, module", [
    ((jax.tree_util.DictKey("params"), jax.tree_util.DictKey("h_0"),
      jax.tree_util.DictKey("attn"), jax.tree_util.DictKey("kernel")), ("params", "h_0", "attn")),
    ((jax.tree_util.DictKey("res_net/~/block_0/~/conv_0"), jax.tree_util.DictKey("w")),
     ("res_net", "block_0", "conv_0")),  # haiku's module names
    ((jax.tree_util.GetAttrKey("convs"), jax.tree_util.SequenceKey(2),
      jax.tree_util.GetAttrKey("weight")), ("convs[2]",)),  # equinox's attribute paths
    ((jax.tree_util.SequenceKey(3), jax.tree_util.SequenceKey(0)), ("[3]",)),  # stax's tuples
])
def test_leaf_module_reads_the_libraries_paths(path, module):
    assert pv.leaf_module(path) == module


def test_class_scopes_give_way_to_weights_and_their_neighbours_on_the_same_line():
    # equinox names its layers' scopes by class (eqx.nn.*), the same for every instance
    params = {"one": {"scale": jnp.ones(8)}, "two": {"scale": jnp.ones(8)}}

    def norm(x, scale, stats):
        with jax.named_scope("eqx.nn.LayerNorm"):
            return (x - stats) * scale  # sub reads no weight: its neighbour (mul) names it

    def f(p, x):
        y = norm(x, p["one"]["scale"], jnp.mean(x))
        return norm(y, p["two"]["scale"], jnp.mean(y))
    closed = ir.trace(f, params, X)
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    weights = {v: pv.leaf_module(p) for v, (p, _) in zip(closed.jaxpr.invars, leaves)}
    subs = [o for name, o in _origins(closed, weights) if name == "sub"]
    assert [(o.module, o.how) for o in subs] == [(("one",), "neighbour"), (("two",), "neighbour")]


def test_trace_order_places_an_unnamed_op_between_two_of_one_module():
    def f(x):
        with jax.named_scope("block"):
            with jax.named_scope("attn"):
                a = jnp.sin(x)
        b = a + x  # a residual add traced outside any scope
        with jax.named_scope("block"):
            with jax.named_scope("mlp"):
                return jnp.cos(b)
    found = dict(_origins(ir.trace(f, X)))
    assert found["add"] == pv.Origin(("block",), "order")


def test_without_names_or_weights_the_users_line_names_the_module():
    def f(x):
        return jnp.exp(x)  # this line
    (name, origin), = _origins(ir.trace(f, X))
    line = f.__code__.co_firstlineno + 1
    assert origin == pv.Origin((f"test_provenance.py:{line}",), "line")


def test_common_and_owner():
    assert pv.common([("a", "b", "c"), ("a", "b"), ("a", "b", "d")]) == ("a", "b")
    assert pv.common([("a",), ("x",)]) == () and pv.common([]) == ()
    assert pv.owner(("GPT2", "wte.attend")) == ("GPT2", "wte")
    assert pv.owner(("attn", "...qhd,...khd->...hqk")) == ("attn", "...qhd,...khd->...hqk")
