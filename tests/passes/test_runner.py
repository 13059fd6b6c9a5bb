"""One runner and one registry: ``run(chain(a, b), g)`` is running ``a`` then ``b`` by hand
(optax-style), ``run(fixpoint(p), g)`` is repeating ``p`` by hand, calling a pipeline directly
gives the same graph, and every pass is built, named and parsed by ``passes.registry``."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import pytest

from mlsys_jax import ir, models, passes as P
from mlsys_jax.errors import MlsysError
from mlsys_jax.fuzz import oracles
from mlsys_jax.fuzz.mutants import MUTANTS
from mlsys_jax.passes import registry

F32 = jnp.float32
C4 = jnp.arange(4.0, dtype=F32)
X = jnp.array([0.5, -1.0, 2.0, 3.0], F32)


def prog(x):  # something for cse (the two sins), fold_constants (C4 * 2) and dce (the exp)
    dead = jnp.exp(x) * 3.0  # noqa: F841
    y = jax.jit(lambda u: jnp.sin(u) * (C4 * 2.0) + jnp.sin(u) * (C4 * 2.0))(x)
    return y + (C4 * 2.0 + 1.0), x * 3.0


def two_conv_bn_sites():
    key = jax.random.PRNGKey(0)
    block = models.resnet_block_init(key, c=4)
    return ir.trace(partial(models.resnet_block, block), jax.ShapeDtypeStruct((2, 4, 6, 6), F32))


def entries(log) -> list:
    """A run's log without the wall-clock seconds."""
    return [(e.pass_name, e.changed, e.rewrites, e.refusals, e.cost_before, e.cost_after)
            for e in log]


def by_hand(passes, g):
    """Run each pass in turn with ``passes.run``; the last graph and the concatenated log."""
    log = []
    for p in passes:
        r = P.run(p, g)
        g, log = r.jaxpr, log + list(r.log)
    return g, log


def test_run_of_a_chain_is_running_each_pass_by_hand():
    g = ir.trace(prog, X)
    parts = (P.cse(), P.fold_constants(), P.dce(), P.inline())
    whole = P.run(P.chain(*parts), g)
    last, log = by_hand(parts, g)
    assert ir.structural_hash(whole.jaxpr) == ir.structural_hash(last)
    assert entries(whole.log) == entries(log)
    assert [e.changed for e in log] == [True, True, False, True]  # every pass had a say
    nested = P.run(P.chain(P.chain(*parts[:2]), P.chain(*parts[2:])), g)
    assert entries(nested.log) == entries(log)
    # calling the chain directly sequences the same passes (without verifying or logging)
    direct = P.chain(*parts)(g)
    assert ir.structural_hash(direct.jaxpr) == ir.structural_hash(last)
    assert direct.changed and direct.rewrites == tuple(whole.rewrites)


@pytest.mark.slow
def test_run_of_a_fixpoint_is_repeating_the_pass_by_hand():
    g = two_conv_bn_sites()
    one_site = P.fold_conv_bn(only=0)  # folds one BN per round: two sites take three rounds
    whole = P.run(P.fixpoint(one_site), g)
    rounds, log, last = 0, [], g
    while True:
        rounds += 1
        r = P.run(one_site, last)
        log += r.log
        if not r.changed:
            break
        last = r.jaxpr
    assert rounds == 3
    assert ir.structural_hash(whole.jaxpr) == ir.structural_hash(last)
    assert entries(whole.log) == entries(log)
    direct = P.fixpoint(one_site)(g)
    assert ir.structural_hash(direct.jaxpr) == ir.structural_hash(last)
    assert len(direct.rewrites) == 2


def _toggle(closed):
    """A pass that alternates between two graphs: a rewrite cycle."""
    state = {"n": 0}

    def fn(c):
        state["n"] += 1
        return P.PassResult(P.dce_jaxpr(c) if state["n"] % 2 else closed, True)
    return P.make_pass("toggle", fn)


def _grow():
    """A pass that always yields a new, larger graph: no fixpoint."""
    return P.make_pass("grow", lambda c: P.PassResult(
        jax.make_jaxpr(lambda *a: [o * 1.0 for o in ir.interpret(c, *a)])(*ir.input_structs(c)),
        True))


@pytest.mark.parametrize("make,message", [
    (_toggle, r"^fixpoint\(toggle\): rewrite cycle — a graph came back$"),
    (lambda g: _grow(), r"^fixpoint\(grow\): no fixpoint within 4 rounds$")],
    ids=["cycle", "no_fixpoint"])
def test_fixpoint_errors_read_the_same_called_directly_or_run(make, message):
    g = ir.trace(prog, X)
    with pytest.raises(P.FixpointError, match=message):
        P.fixpoint(make(g), max_iter=4)(g)
    with pytest.raises(P.FixpointError, match=message):
        P.run(P.fixpoint(make(g), max_iter=4), g, verify=False)


def test_the_registry_names_builds_and_classifies_every_pass():
    assert registry.NAMES == tuple(registry.PASSES)
    for name, e in registry.PASSES.items():
        assert registry.make(name).name == name
        assert e.kind in (registry.STRUCTURAL, registry.NUMERIC)
        assert oracles.tier(name) == (oracles.BITWISE if e.kind == registry.STRUCTURAL
                                      else oracles.NUMERIC)
        if e.search_move:  # a move applies one site at a time
            assert registry.make(name, only=0).name == f"{name}@0"
    assert set(registry.DEFAULT_PIPELINE) <= set(registry.NAMES)
    assert registry.pipeline().name == f"chain({','.join(registry.DEFAULT_PIPELINE)})"
    assert registry.pipeline(" dce , cse").name == "chain(dce,cse)" == \
        registry.pipeline(["dce", "cse"]).name
    assert {m.target for m in MUTANTS} - {"data_parallel"} <= set(registry.NAMES)
    assert set(registry.search_moves()) == set(registry.search_move_names())


@pytest.mark.parametrize("call,message", [
    (lambda: registry.pipeline("dce,bogus", "--passes"),
     "--passes: unknown pass(es) 'bogus'; choose from dce, cse, "),
    (lambda: registry.pipeline(",", "--passes"), "--passes is empty; give a comma-separated list"),
    (lambda: registry.instantiate(["nope"], "fuzz"), "fuzz: unknown pass(es) 'nope'"),
    (lambda: registry.search_moves(["dce"]),
     "search: unknown pass(es) 'dce'; choose from fold_conv_bn, merge_parallel_convs, "
     "enlarge_conv_kernel"),
    (lambda: registry.make("nope"), "unknown pass(es) 'nope'"),
], ids=["optimize", "empty", "fuzz", "search", "make"])
def test_unknown_names_get_the_one_message(call, message):
    with pytest.raises(MlsysError) as e:
        call()
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1
