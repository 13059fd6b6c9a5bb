"""How passes build jaxprs (passes/engine.py, ir/edit.py) and how the verifier checks them
incrementally (passes/verify.py): equations JAX built are kept as they are, only replacements are
traced, and the verifier still catches malformed results and mutated inputs."""
from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import ir, passes as P
from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.passes.verify import VerificationError

verify = importlib.import_module("mlsys_jax.passes.verify")  # (passes.verify is the function)

F32 = jnp.float32
X = jnp.array([0.5, -1.0, 2.0, 3.0], F32)
C4 = jnp.arange(4.0, dtype=F32)


def _dup(x):
    a, b = jnp.sin(x) * 2.0, jnp.sin(x) * 2.0
    return jnp.tanh(a + b) * C4


def test_structural_passes_keep_jaxs_equations():
    closed = ir.trace(_dup, X)
    new = P.run(P.cse(), closed).jaxpr
    assert len(new.jaxpr.eqns) == len(closed.jaxpr.eqns) - 2  # the second sin and mul merged
    old_ids = {id(e) for e in closed.jaxpr.eqns}
    kept = [e for e in new.jaxpr.eqns if id(e) in old_ids]
    # every equation reading only unchanged values is the very object JAX built (not re-traced);
    # the one reading a merged value is a copy with the same params object
    assert len(kept) == len(new.jaxpr.eqns) - 1
    add = next(e for e in new.jaxpr.eqns if e.primitive.name == "add")
    twin = next(e for e in closed.jaxpr.eqns if e.primitive.name == "add")
    assert add.params is twin.params and add.invars[0] is add.invars[1]


def test_only_equations_jax_has_not_typed_are_type_checked(monkeypatch):
    checked = []
    real = verify.check_equation
    monkeypatch.setattr(verify, "check_equation", lambda e: (checked.append(e), real(e)))
    P.run(P.cse(), ir.trace(_dup, X))
    assert checked == []  # same primitive, params and input types as equations JAX typed

    def retrace(c):  # every equation bound again: all of them are new, each is checked once
        return P.PassResult(ir.rebuild(c, lambda e, v: [jnp.cos(v[0])] if e.primitive.name ==
                                       "tanh" else None), True)
    res = P.run(P.make_pass("retrace", retrace), ir.trace(_dup, X))
    assert [e.primitive.name for e in checked] == [e.primitive.name for e in res.jaxpr.jaxpr.eqns]


def test_inlining_one_body_twice_gives_fresh_variables():
    g = jax.jit(lambda u: jnp.sin(u) * C4)
    closed = ir.trace(lambda x: g(x) + g(x * 2.0), X)
    res = P.run(P.inline(), closed)  # the verifier rejects a variable bound twice
    assert ir.primitive_counts(res.jaxpr)["jit"] == 0
    assert ir.primitive_counts(res.jaxpr)["sin"] == 2
    np.testing.assert_array_equal(ir.interpret(res.jaxpr, X)[0], ir.interpret(closed, X)[0])


def test_numeric_rewrite_traces_only_what_it_replaces():
    from mlsys_jax import models
    from experiments.s02_graph_opt import block_params

    params = block_params(4, F32, 0)
    closed = ir.trace(lambda x: models.resnet_block(params, x), jax.ShapeDtypeStruct((2, 4, 6, 6), F32))
    new = P.run(P.fold_conv_bn(), closed).jaxpr
    # conv+BN pairs became traced conv_bias calls; the add after them is JAX's own equation (the
    # same params object) reading the new values. (relu's custom_jvp_call gets new params from
    # JAX's DCE rule for it, which the pass runs afterwards.)
    old = {id(e.params) for e in closed.jaxpr.eqns}
    kept = [e.primitive.name for e in new.jaxpr.eqns if id(e.params) in old]
    made = [e.params.get("name", e.primitive.name) for e in new.jaxpr.eqns
            if id(e.params) not in old]
    assert kept == ["add"] and made == ["conv_bias", "conv_bias", "custom_jvp_call"]


def _mutating(fn):
    def run_pass(c):
        fn(c)
        return P.PassResult(c, False)
    return P.make_pass("mutator", run_pass)


def _new_params(c):
    # A new equation in the input's list, not an edit of its params dict: JAX shares that dict
    # with later traces of the same primitive, so editing it would change every later sin.
    first = c.jaxpr.eqns[0]
    c.jaxpr.eqns[0] = first.replace(params={**first.params, "accuracy": "high"})


@pytest.mark.parametrize("how", ["swap inputs", "params", "drop equation", "outputs"])
def test_verifier_sees_any_in_place_mutation_of_the_input(how):
    closed = ir.trace(_dup, X)
    add = next(e for e in closed.jaxpr.eqns if e.primitive.name == "add")
    mutate = {"swap inputs": lambda c: add.invars.reverse(),
              "params": _new_params,
              "drop equation": lambda c: c.jaxpr.eqns.pop(),
              "outputs": lambda c: c.jaxpr.outvars.__setitem__(0, add.outvars[0])}[how]
    with pytest.raises(VerificationError, match="mutated its input"):
        P.run(_mutating(mutate), closed)


def _edited(change):
    def run_pass(c):
        eqns = list(c.jaxpr.eqns)
        change(eqns)
        return P.PassResult(ClosedJaxpr(c.jaxpr.replace(eqns=eqns), c.consts), True)
    return P.make_pass("editor", run_pass)


def test_verifier_rejects_malformed_edits():
    closed = ir.trace(_dup, X)
    with pytest.raises(VerificationError, match="not defined"):  # read before it is bound
        P.run(_edited(lambda eqns: eqns.reverse()), closed)
    two = ir.trace(lambda x: (jnp.sum(x), x * 2.0), X)

    def mistype(eqns):  # mul reads the scalar sum instead of x: JAX's type check fails
        eqns[1] = eqns[1].replace(invars=[eqns[0].outvars[0], eqns[1].invars[1]])
    with pytest.raises(VerificationError, match="check_jaxpr failed"):
        P.run(_edited(mistype), two)
    with pytest.raises(VerificationError, match="not a variable"):
        P.run(_edited(lambda eqns: eqns.insert(0, eqns[0].replace(outvars=[X]))), closed)
