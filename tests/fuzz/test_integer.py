"""The fuzzer beyond floating point (docs/verification.md §2, §3): integer and boolean programs, PRNG keys,
special input values — and oracles that judge integers bitwise and NaN/Inf NaN-aware, so that a
fold legal only over the reals is caught (the integer conv + truncating division of the lecture's
§4.1 rule, folded as if it were real division)."""
import collections

import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import passes
from mlsys_jax.fuzz import Spec, generate_seeded, oracles, program_seed
from mlsys_jax.fuzz.program import build, make_inputs
from mlsys_jax.fuzz.campaign import CampaignOptions, run_campaign
from mlsys_jax.fuzz.judge import check_program, finite_inputs_only
from mlsys_jax.fuzz.mutants import MUTANTS
from mlsys_jax.fuzz.spec import Knobs, all_ops
from mlsys_jax.ir import evaluate, rebuild

INT_DIV_FOLD = next(m for m in MUTANTS if m.name == "conv_bn_folds_int_div")
CONV = {"op": "conv", "out": 8, "k": 3, "stride": 1, "pad": "SAME", "dil": 1, "groups": 1,
        "precision": None, "seed": 3, "args": [0]}
# the unsafe case: an int32 3x3 conv, then lax.div by 3 (truncating)
CONV_DIV = Spec("nchw", "i32", [[2, 4, 9, 9]],
                [CONV, {"op": "ibn", "form": "scalar_div", "seed": 5, "args": [1]}], [2])


def test_generator_draws_integer_boolean_keyed_and_special_programs():
    kinds, int_ops, int_fns = collections.Counter(), set(), set()
    for i in range(200):
        spec = generate_seeded(program_seed(0, i))
        kinds[spec.dtype] += 1
        kinds["special"] += spec.special
        kinds["keys"] += spec.keys > 0
        if spec.dtype in ("i32", "bool"):
            int_ops |= all_ops(spec.nodes)
            int_fns |= {(n["op"], n.get("fn") or n.get("form")) for n in spec.nodes}
    assert kinds["i32"] >= 10 and kinds["bool"] >= 3 and kinds["special"] >= 10, kinds
    assert kinds["keys"] >= 5 and kinds["f32"] >= 100, kinds
    assert {"conv", "ibn", "cmp", "select", "logic", "from_bool", "rng"} <= int_ops, int_ops
    # truncating division and remainder after convs and by constants, shifts
    assert {("ibn", "scalar_div"), ("ibn", "div"), ("ibn", "rem"), ("scalar", "div"),
            ("scalar", "rem")} <= int_fns, int_fns
    assert {("scalar", "shl"), ("scalar", "shr")} & int_fns, int_fns


def test_special_inputs_and_keys():
    values = []
    for seed in range(12):
        spec = Spec("dense", "f32", [[4, 8]], [{"op": "unary", "fn": "sin", "args": [0]}], [1],
                    special=True, keys=1)
        x, key = make_inputs(spec, seed)
        x64 = make_inputs(spec, seed, "f64")[0]
        assert np.asarray(x64).tobytes() == np.asarray(x, np.float64).tobytes()  # same values
        assert str(key.dtype).startswith("key")
        values += list(np.asarray(x).ravel())
    v = np.asarray(values)
    assert np.isnan(v).any() and np.isposinf(v).any() and np.isneginf(v).any()
    assert (np.signbit(v) & (v == 0)).any()                                       # -0.0
    assert ((np.abs(v) > 0) & (np.abs(v) < np.finfo(np.float32).tiny)).any()      # subnormal
    ints = make_inputs(Spec("dense", "i32", [[64, 8]], [], [0], special=True), 1)[0]
    assert {int(jnp.iinfo(jnp.int32).min), int(jnp.iinfo(jnp.int32).max)} & set(
        np.asarray(ints).ravel().tolist())


@pytest.mark.slow
@pytest.mark.parametrize("knobs", [Knobs(integer=1.0, boolean=0.5, keys=0.5),
                                   Knobs(integer=0.0, special_inputs=1.0, keys=1.0)],
                         ids=["integer", "special+key"])
def test_integer_and_special_programs_pass_an_identity_rebuild(knobs):
    seed = program_seed(0, 0)
    spec = generate_seeded(seed, knobs)
    closed = build(spec)
    ref = oracles.reference(spec, closed, seed)
    for tier in (oracles.BITWISE, oracles.NUMERIC):
        v = oracles.compare(ref, rebuild(closed), tier)
        assert v.ok, v.failures


def _bump(closed, prim, change):
    """``closed`` with the output of every ``prim`` equation passed through ``change``."""
    def handler(eqn, invals):
        if eqn.primitive.name == prim:
            return [change(eqn.primitive.bind(*invals, **eqn.params))]
        return None
    return rebuild(closed, handler)


def test_integers_are_exact_even_for_a_numeric_pass():
    """x * 1000003 + 1 is within float32's tolerance of x * 1000003, and wrong."""
    spec = Spec("dense", "i32", [[4, 8]],
                [{"op": "scalar", "fn": "mul", "c": 1000003, "args": [0]}], [1])
    closed = build(spec)
    ref = oracles.reference(spec, closed, 0)
    v = oracles.compare(ref, _bump(closed, "mul", lambda y: y + 1), oracles.NUMERIC)
    assert v.failures and "not bitwise equal (32 of 32 values differ" in v.failures[0]


def test_nan_or_inf_where_the_original_is_finite_is_a_mismatch():
    spec = Spec("dense", "f32", [[4, 8]], [{"op": "unary", "fn": "sin", "args": [0]}], [1])
    closed = build(spec)
    ref = oracles.reference(spec, closed, 0)
    for bad in (jnp.nan, jnp.inf):
        new = _bump(closed, "sin", lambda y: y.at[0, 0].set(bad))  # noqa: B023 (called in this iteration)
        v = oracles.compare(ref, new, oracles.NUMERIC)  # max(0.0, nan) would have said 0
        assert v.failures == ["output 0: 1 NaN/Inf value(s) where the original is finite"]
    # and a NaN of the original made finite (x * 0 -> 0 on a NaN input)
    special = Spec("dense", "f32", [[4, 8]], [{"op": "nan_unsafe", "fn": "mul0", "args": [0]}],
                   [1], special=True)
    ref = oracles.reference(special, build(special), 0)
    assert not np.isfinite(ref.outputs[0]).all()
    v = oracles.compare(ref, _bump(build(special), "mul", jnp.nan_to_num), oracles.NUMERIC)
    assert v.failures and "finite value(s) where the original is NaN/Inf" in v.failures[0]


def test_enlarge_makes_nan_of_an_inf_input_so_it_is_judged_on_finite_inputs():
    """enlarge_conv_kernel's documented precondition, seen by the oracle: 0·Inf in the new taps."""
    spec = Spec("nchw", "f32", [[1, 4, 6, 6]], [dict(CONV, out=4), dict(CONV, k=1, out=4)],
                [1, 2])  # a 3x3 and a 1x1 conv on one input: the 1x1 grows to 3x3
    closed = build(spec)
    x = np.ones((1, 4, 6, 6), np.float32)
    x[0, 0, 3, 3] = np.inf
    ref = oracles.Reference(spec, closed, [x], evaluate.evaluate(closed, x), 0, "none")
    enlarged = passes.run(passes.enlarge_conv_kernel(), closed).jaxpr
    v = oracles.compare(ref, enlarged, oracles.NUMERIC)
    assert v.failures and "NaN/Inf value(s) where the original is finite" in v.failures[0]
    assert finite_inputs_only("enlarge_conv_kernel")
    special = Spec(spec.layout, spec.dtype, spec.inputs, spec.nodes, spec.outputs, special=True)
    out = check_program(special, {"enlarge_conv_kernel": passes.enlarge_conv_kernel()}, 0)
    assert out.rewrites["enlarge_conv_kernel"] and not out.failures, out.failures


@pytest.mark.slow
def test_an_integer_division_folded_into_a_conv_is_caught():
    """The unsafe fold (a mutant, so this test holds whatever the real pass does): on the
    unsafe case (CONV_DIV), and on a campaign of random integer conv programs."""
    broken = {"fold_conv_bn": INT_DIV_FOLD.make()}
    out = check_program(CONV_DIV, broken, 0)
    assert [(f.pass_name, f.kind) for f in out.failures] == [("fold_conv_bn", "mismatch")]
    assert "not bitwise equal" in out.failures[0].message
    knobs = Knobs(integer=1.0, boolean=0.0, image=1.0, conv_motifs=1.0, wrapper=0.0)
    # stops at the first failure: at seed 4 that is program 16 (of up to 30)
    s = run_campaign(30, 4, broken, options=CampaignOptions(
        knobs=knobs, system_every=0, gradient_every=0, stop_at_first_failure=True,
        shrink_failures=False))
    assert s.mismatches >= 1 and s.failures[0].pass_name == "fold_conv_bn", s.as_dict()
    assert "not bitwise equal" in s.failures[0].message
