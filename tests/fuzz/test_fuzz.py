"""The fuzzer's own parts: generator, builder, oracles (an identity rebuild passes every tier;
a broken rewrite fails), shrinking a broken pass's failure and reproducers, the hypothesis
strategy."""
import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from mlsys_jax.fuzz import Spec, generate_seeded, program_seed, oracles
from mlsys_jax.fuzz.program import build
from mlsys_jax.fuzz.judge import apply_pass, check_program, reason
from mlsys_jax.fuzz.mutants import MUTANTS
from mlsys_jax.fuzz.reproduce import replay, reproducer_source, shrink
from mlsys_jax.fuzz.spec import all_ops
from mlsys_jax.ir import as_function, rebuild
from mlsys_jax.passes import registry
from tests.fuzz.fuzz_strategies import specs

SEEDS = [program_seed(11, i) for i in range(6)]


def test_generator_is_deterministic_and_json_roundtrips():
    a, b = generate_seeded(5), generate_seeded(5)
    assert a == b
    assert Spec.from_json(a.to_json()) == a
    assert generate_seeded(6) != a


def test_generator_covers_the_opportunity_knobs():
    ops = set()
    for i in range(150):
        ops |= all_ops(generate_seeded(program_seed(0, i)).nodes)
    wanted = {"conv", "bn", "train_bn", "pow", "reduce", "const", "wconst", "debug", "opaque",
              "jit", "checkpoint", "cond", "scan", "while", "custom_jvp", "custom_vjp",
              "nan_unsafe", "matmul", "helper", "dense", "attention", "typed"}
    assert wanted <= ops, wanted - ops


# A few programs, on every tier with their derivatives: the campaign (tests/fuzz/test_campaign.py)
# also judges the identity rebuild of each of its programs bitwise.
@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_identity_rebuild_passes_every_oracle(seed):
    spec = generate_seeded(seed)
    closed = build(spec)
    try:
        ref = oracles.reference(spec, closed, seed)
    except oracles.Rejected:
        pytest.skip("program rejected (non-finite)")
    for tier in (oracles.BITWISE, oracles.NUMERIC):
        v = oracles.compare(ref, rebuild(closed), tier)
        assert v.ok, v.failures


def _swap_sin_for_cos(closed):
    def handler(eqn, invals):
        if eqn.primitive.name == "sin":
            return [jax.numpy.cos(invals[0])]
        return None
    return rebuild(closed, handler)


def test_oracles_catch_a_wrong_rewrite_and_a_type_change():
    spec = Spec("dense", "f32", [[4, 8]], [{"op": "unary", "fn": "sin", "args": [0]}], [1])
    closed = build(spec)
    ref = oracles.reference(spec, closed, 0)
    assert not oracles.compare(ref, _swap_sin_for_cos(closed), oracles.NUMERIC).ok
    strong = Spec("dense", "f32", [[4, 8]],
                  [{"op": "wconst", "fn": "cos", "c": 0.5, "args": []}], [1])
    weak_ref = oracles.reference(strong, build(strong), 0)
    as_strong = jax.make_jaxpr(lambda x: np.cos(np.float64(0.5)) + 0 * jax.numpy.sum(x))(
        np.zeros((4, 8), np.float32))
    v = oracles.compare(weak_ref, as_strong, oracles.NUMERIC)
    assert v.failures and "types" in v.failures[0]


def test_numeric_tier_uses_the_float64_reference_for_tiny_variance():
    # err(new) <= 2 err(orig) + 1e-5 passes; a 10x larger error does not
    ref = np.array([1000.0], np.float64)
    orig = np.array([1000.001], np.float32)
    assert oracles.error_ratio(np.array([999.999], np.float32), orig, ref) < 2
    assert oracles.error_ratio(np.array([1000.02], np.float32), orig, ref) > 2


def test_float64_twin_vouches_only_for_a_rewrite_that_mirrors_it():
    """The twin may excuse a float32 excess only if the rewrite is the twin's at another dtype."""
    import ml_dtypes

    w = np.linspace(-1.0, 1.0, 8)
    x32, x64 = np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float64)
    scaled = lambda c: jax.make_jaxpr(lambda x: x * c + 1e-8)  # noqa: E731
    orig, orig64 = scaled(w.astype(np.float32))(x32), scaled(w)(x64)
    assert oracles.mirrors(orig, orig64, orig, orig64, "f32") == ""
    # a literal that underflows in float16 (1e-8 -> 0) is rounded alike on the twin's side
    x16 = np.zeros((4, 8), np.float16)
    orig16 = scaled(w.astype(np.float16))(x16)
    assert oracles.mirrors(orig16, orig64, orig16, orig64, "f16") == ""
    # a pass that rounds a constant to bfloat16 in float32 programs only: the twin is exact
    lossy = scaled(w.astype(ml_dtypes.bfloat16).astype(np.float32))(x32)
    assert "ulp" in oracles.mirrors(lossy, orig64, orig, orig64, "f32")
    # a round trip through bfloat16 that the twin does not make
    cast = jax.make_jaxpr(lambda x: (x.astype(jax.numpy.bfloat16) * w.astype(np.float32)
                                     ).astype(np.float32) + 1e-8)(x32)
    assert "casts" in oracles.mirrors(cast, orig64, orig, orig64, "f32")
    # a different program
    other = jax.make_jaxpr(lambda x: jax.numpy.sin(x * w.astype(np.float32)) + 1e-8)(x32)
    assert "differs" in oracles.mirrors(other, orig64, orig, orig64, "f32")
    # a constant that is NaN where the twin's is finite (NaN - x compares as no ulp at all)
    nan = w.copy()
    nan[3] = np.nan
    assert "Inf/NaN" in oracles.mirrors(scaled(nan.astype(np.float32))(x32), orig64, orig,
                                        orig64, "f32")
    inf = np.where(np.arange(8) == 0, np.inf, w)  # Inf where the twin has Inf: no difference
    assert oracles.mirrors(scaled(inf.astype(np.float32))(x32), scaled(inf)(x64), orig,
                           orig64, "f32") == ""


# 10k-campaign reproducers (seed 0), shrunk: fold_matmul_scale exact in real arithmetic, its
# float32/float16 excess amplified by pow chains; the twin could not vouch for them program-wide.
# 9713: the float64 program alone casts a dead float32 draw to float64 (the rewrite drops it).
TWIN_DEAD_CAST = (3178590862, 0, {
    "dtype": "f32", "inputs": [[4, 8]], "keys": 1, "layout": "dense", "special": False,
    "nodes": [{"args": [0], "form": "scores_scaled", "op": "attention", "seed": 577257683},
              {"args": [1], "op": "pow", "y": 2},
              {"args": [1], "fn": "uniform", "op": "rng", "seed": 29},
              {"args": [2], "name": "blk18", "op": "while",
               "body": [{"args": [0], "op": "pow", "y": 3},
                        {"args": [0, 1], "fn": "max", "op": "binary"}]}],
    "outputs": [4]})
# 6091: a float16 variance is subnormal, so no known constant: the Dense + BN of output 0 folds
# its scale only in float16; output 1's attention is folded alike at both dtypes.
TWIN_OTHER_OUTPUT = (3790859076, 1, {
    "dtype": "f16", "inputs": [[4, 8]], "keys": 0, "layout": "dense", "special": True,
    "nodes": [{"args": [0], "bias_axis": None, "n": 8, "op": "dense", "seed": 1581750045},
              {"args": [1], "eps": 0.001, "form": "rsqrt", "neg_gamma": False, "op": "bn",
               "seed": 879058974, "var": "tiny"},
              {"args": [0], "form": "q_scaled", "op": "attention", "seed": 1270535287},
              {"args": [3], "op": "pow", "y": 3},
              {"args": [], "fn": "sin", "op": "const", "seed": 1827851165, "shape": [4, 8]},
              {"args": [4, 5], "fn": "max", "op": "binary"}],
    "outputs": [2, 6]})


def _judge_matmul_scale(spec: Spec, seed: int, p, validate: bool = True):
    closed = build(spec)
    ref = oracles.reference(spec, closed, seed, gradients=False)
    return oracles.compare(ref, apply_pass(p, closed, validate).jaxpr, oracles.NUMERIC,
                           gradients=False,
                           rewrite64=lambda: apply_pass(p, ref.closed64, validate).jaxpr)


@pytest.mark.parametrize("case", [TWIN_DEAD_CAST, TWIN_OTHER_OUTPUT], ids=["9713", "6091"])
def test_float64_twin_vouches_for_the_output_whose_computation_mirrors_it(case):
    """The twin is asked about what the excused output is computed by: dead code and another
    output's computation may differ by dtype."""
    seed, out, raw = case
    spec = Spec.from_json(raw)
    assert replay(spec, "fold_matmul_scale", seed) == []
    v = _judge_matmul_scale(spec, seed, registry.make("fold_matmul_scale"))
    assert v.ok and v.twin_checks == 1  # past the allowance, excused by the twin
    if out == 1:  # output 0's computation differs from its twin's, and would not be excused
        p = registry.make("fold_matmul_scale")
        closed, closed64 = build(spec), build(spec, "f64")
        new, new64 = apply_pass(p, closed).jaxpr, apply_pass(p, closed64).jaxpr
        assert "differs" in oracles.mirrors(new, new64, closed, closed64, "f16", (0,))
        assert oracles.mirrors(new, new64, closed, closed64, "f16", (1,)) == ""


def _wrong_below_float64(wrong):
    """fold_matmul_scale with its folded weights made ``wrong`` in programs narrower than float64
    only: translation validation (float64) and the float64 twin see the exact fold."""
    from mlsys_jax.passes.rewrite.mutate import during as _during
    from mlsys_jax.passes.rewrite import fold
    real = fold.scale_weights

    def lossy(w, vec, site, dtype):
        out = real(w, vec, site, dtype)
        return wrong(out) if isinstance(out, np.ndarray) and out.dtype != np.float64 else out
    return _during(registry.make("fold_matmul_scale"), (fold, "scale_weights", lossy))


@pytest.mark.parametrize("case,wrong", [
    (TWIN_DEAD_CAST, lambda w: w.astype(jax.numpy.bfloat16).astype(w.dtype)),
    (TWIN_OTHER_OUTPUT, lambda w: (w * 1.25).astype(w.dtype))], ids=["9713", "6091"])
def test_float64_twin_still_refuses_a_wrong_fold_on_the_output_it_would_excuse(case, wrong):
    """Past translation validation (off here: in a float16 region it now refuses a fold that
    loses precision against the original's own rounding, see the next test), the float64 twin
    still refuses the wrong fold on the output it would otherwise excuse."""
    seed, out, raw = case
    v = _judge_matmul_scale(Spec.from_json(raw), seed, _wrong_below_float64(wrong),
                            validate=False)
    failed = [f for f in v.failures if f.startswith(f"output {out}:")]
    assert failed and "a constant differs from its float64 twin" in failed[0], v.failures


def test_translation_validation_refuses_a_float16_fold_wrong_below_float64():
    """The wrong fold of the case above (weights ×1.25 in float16 only) never ships: validation
    in the program's dtype refuses it with the measured reason."""
    seed, _, raw = TWIN_OTHER_OUTPUT
    res = apply_pass(_wrong_below_float64(lambda w: (w * 1.25).astype(w.dtype)),
                     build(Spec.from_json(raw)))
    refused = [r.reason for r in res.refusals if r.check == "translation_validation"]
    assert not res.changed and refused and "loses precision in float16" in refused[0], refused


def test_derivative_modes_are_the_ones_jax_can_take():
    """Reverse mode unless a while loop forbids it (forward mode then), none for what has no
    derivative: each mode is one JAX takes on that program, and the one before it fails."""
    body = [{"op": "unary", "fn": "sin", "args": [0]}]
    plain = Spec("dense", "f32", [[4, 8]], body, [1])
    looped = Spec("dense", "f32", [[4, 8]], [{"op": "while", "args": [0], "name": "w",
                                              "body": body}], [1])
    integer = Spec("dense", "i32", [[4, 8]], [{"op": "unary", "fn": "neg", "args": [0]}], [1])
    x = np.ones((4, 8), np.float32)
    assert oracles.derivative_mode(plain) == "vjp"
    out, pull = jax.vjp(as_function(build(plain)), x)
    pull(out)
    assert oracles.derivative_mode(looped) == "jvp"
    f = as_function(build(looped))
    out, pull = jax.vjp(f, x)
    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work"):
        pull(out)
    jax.jvp(f, (x,), (x,))
    ref = oracles.reference(looped, build(looped), 0)
    assert ref.derivative is not None and ref.mode == "jvp"
    assert oracles.derivative_mode(integer) == "none"
    assert oracles.reference(integer, build(integer), 0).derivative is None


def _first_failure(broken: dict, kind: str, limit: int = 20):
    """The first campaign program (seed 0) on which the broken pass fails with a failure of
    ``kind``, and that failure."""
    for i in range(limit):
        seed = program_seed(0, i)
        spec = generate_seeded(seed)
        failures = [f for f in check_program(spec, broken, seed, gradients=False).failures
                    if f.pass_name in broken and f.kind == kind]
        if failures:
            return spec, failures[0]
    pytest.fail(f"no {kind} failure of {list(broken)} in {limit} programs")


# two kinds of failure: a bitwise mismatch (param-blind CSE) and a verifier failure (lost effects)
@pytest.mark.slow
@pytest.mark.parametrize("name,kind", [("cse_ignores_params", "mismatch"),
                                       ("dce_drops_effects", "verifier")])
def test_shrink_keeps_a_broken_pass_failing_for_the_same_reason(name, kind):
    mutant = next(m for m in MUTANTS if m.name == name)
    broken = {mutant.target: mutant.make()}
    spec, failure = _first_failure(broken, kind)
    assert (failure.pass_name, failure.kind) == (mutant.target, kind)
    small = shrink(failure, broken)
    assert small.spec.size() < spec.size()
    got = replay(small.spec, mutant.target, failure.seed, passes=broken)
    assert reason(failure.kind, failure.message) in [reason(k, m) for k, m in got]
    assert reason(small.kind, small.message) == reason(failure.kind, failure.message)
    assert replay(small.spec, mutant.target, failure.seed) == []  # the real pass is correct
    # its reproducer, saved as a test of the real pass, passes
    ns = {}
    exec(compile(reproducer_source(small), "repro.py", "exec"), ns)
    ns["test_reproducer"]()
    assert "xfail(strict=True" in reproducer_source(small, xfail_reason="a known bug")


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(specs())
def test_hypothesis_specs_trace_and_pass_dce(spec):
    outcome = check_program(spec, _dce(), 0, gradients=False)
    assert not outcome.failures, outcome.failures


def _dce():
    from mlsys_jax.passes import dce
    return {"dce": dce()}


@pytest.mark.slow
def test_cli_json_reports_every_campaign_figure(capsys):
    import json

    from mlsys_jax import cli

    argv = ["fuzz", "--programs", "3", "--seed", "2", "--passes", "dce,cse", "--json"]
    assert cli.main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"programs", "valid", "rejected", "per_pass", "verifier_failures", "mismatches",
            "worst_error_ratio", "seed", "seconds", "fixpoint_failures", "fixpoint_programs",
            "validation_refusals"} <= set(d)
    assert d["programs"] == 3 and set(d["per_pass"]) == {"dce", "cse"}
    assert set(d["per_pass"]["cse"]) == {"fired", "rewrites"}


def shrunk_cse_failure() -> Spec:
    """What Hypothesis shrinks a param-blind CSE's first failure to."""
    from hypothesis import find

    from mlsys_jax.fuzz.mutants import cse_ignoring_params

    broken = {"cse": cse_ignoring_params()}

    def cse_fails(spec):  # CSE's own failure: any other (a numerical quirk) is not this bug
        return any(f.pass_name == "cse" for f in check_program(spec, broken, 0,
                                                                gradients=False).failures)
    # report_multiple_bugs=False: shrink the first failure found. Otherwise Hypothesis keeps
    # generating for up to 10 s of wall time after it, and what it shrinks depends on the load
    return find(specs(), cse_fails,
                settings=settings(max_examples=200, deadline=None, database=None,
                                  derandomize=True, report_multiple_bugs=False,
                                  suppress_health_check=list(HealthCheck)))


@pytest.mark.slow
def test_hypothesis_shrinks_a_broken_pass_to_a_small_program():
    """The strategy's point: a param-blind CSE is caught and shrunk to its near-duplicates. In a
    fresh process: the shrink path follows every failure on the way, and what ran before in this
    process (an in-process `fuzz` command) has been seen to change it."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import tests.conftest; from tests.fuzz.test_fuzz import shrunk_cse_failure; "
            "print(shrunk_cse_failure().to_json())")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    small = Spec.from_json(out.stdout.strip().splitlines()[-1])
    assert small.size() <= 10, small
    assert not any("body" in n for n in small.nodes)
    assert {"pow", "reduce", "scalar"} & all_ops(small.nodes)
