"""The end-to-end value check (passes/value_check.py): per element, on the example and fresh inputs,
with a float64 twin for rounding; constant outputs and stateful RNG never give a bare "yes"."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import ir
from mlsys_jax.errors import MlsysError
from mlsys_jax.passes.value_check import FRESH, check_values, input_sets, tolerance


def _closed(fn, n=6, dtype=jnp.float32):
    return ir.trace(fn, jax.ShapeDtypeStruct((n,), dtype))


X = [jnp.linspace(0.5, 2.0, 6, dtype=jnp.float32)]


def test_every_element_is_held_to_its_own_tolerance():
    """concatenate([y, x·1e5]): the large half must not widen the small half's tolerance."""
    def made(fn):
        return _closed(lambda v: jnp.concatenate([fn(v), v * 1e5]), n=96)
    x = [jnp.linspace(-3, 3, 96, dtype=jnp.float32)]
    good, bad = made(jnp.sin), made(lambda v: jnp.sin(v) * 1.01)
    c = check_values(good, bad, x)
    y = np.sin(np.asarray(x[0], np.float64))
    rtol, atol = tolerance(np.dtype("float32"))
    per_input = int(np.sum(np.abs(0.01 * y) > atol + rtol * np.abs(y)))
    assert c.verdict == "no" and per_input > 80
    # each input set shows them; a max-based tolerance (atol + rtol·max|original|) would not
    assert c.wrong >= per_input and 0.01 * np.max(np.abs(y)) < rtol * 3e5
    assert check_values(good, made(jnp.sin), x).verdict == "yes"


def test_nan_inf_and_closeness():
    assert check_values(_closed(jnp.sin), _closed(jnp.sin), X).verdict == "yes"
    nan = check_values(_closed(jnp.sin), _closed(lambda v: jnp.sin(v) / (v - v)), X)
    assert nan.verdict == "no" and nan.new_nonfinite == 6 * (1 + FRESH)
    assert "NaN/Inf" in nan.problems[0]
    close = check_values(_closed(jnp.sin), _closed(lambda v: jnp.sin(v) * (1 + 1e-6)), X)
    assert close.verdict == "yes" and close.max_abs_diff > 0
    far = check_values(_closed(jnp.sin), _closed(jnp.cos), X)
    assert far.verdict == "no" and "beyond atol + rtol·|original|" in far.problems[0]
    kept = check_values(_closed(lambda v: v / 0), _closed(lambda v: v / 0), X)
    assert kept.ok  # an Inf the original has is not a new one


def test_the_float64_twin_tells_rounding_that_cancels_from_a_wrong_value():
    """(x·3e7 + 1) − x·3e7 is rounding noise in float32; the same sum reordered is exactly 1.
    Per element the two disagree far beyond the float32 tolerance, but the original is as far
    from the float64 twin: rounding, not a wrong rewrite. 1 + 1e-3 is wrong either way."""
    noisy = _closed(lambda v: (v * 3e7 + 1.0) - v * 3e7)
    exact = _closed(lambda v: (v * 3e7 - v * 3e7) + 1.0)
    a, b = (np.asarray(ir.interpret(c, *X)[0]) for c in (noisy, exact))
    rtol, atol = tolerance(np.dtype("float32"))
    assert np.any(np.abs(a - b) > atol + rtol * np.abs(a))  # the plain tolerance would fail it
    assert check_values(noisy, exact, X).verdict == "yes"
    assert check_values(exact, _closed(lambda v: v * 0 + 1.001), X).verdict == "no"


def test_a_float64_output_computed_through_float32_gets_the_float32_tolerance():
    x = [jnp.linspace(0.5, 2.0, 6, dtype=jnp.float64)]
    through32 = _closed(lambda v: jnp.sin(v.astype(jnp.float32)).astype(jnp.float64),
                        dtype=jnp.float64)
    sin64 = _closed(jnp.sin, dtype=jnp.float64)
    rounded = check_values(through32, sin64, x)
    assert rounded.ok and rounded.max_abs_diff > tolerance(np.dtype("float64"))[0]
    off = _closed(lambda v: jnp.sin(v) + 1e-7, dtype=jnp.float64)
    assert not check_values(sin64, off, x).ok


def test_integers_and_keys_must_be_equal():
    x = [jnp.arange(6, dtype=jnp.float32)]
    ints = check_values(_closed(lambda v: v.astype(jnp.int32)),
                        _closed(lambda v: (v + 1).astype(jnp.int32)), x)
    assert not ints.ok and "differs in 6 of 6" in ints.problems[0]
    keys = lambda s: _closed(lambda v: jax.random.split(jax.random.fold_in(  # noqa: E731
        jax.random.key(s), v[0].astype(jnp.int32)), 6))
    assert check_values(keys(0), keys(0), x).verdict == "yes"
    assert not check_values(keys(0), keys(1), x).ok


def test_an_output_constant_on_every_input_is_no_evidence():
    """A zero-initialised last layer gives the same output for every input: comparing it can
    refute nothing, so the verdict is "not established", whatever the rewrite did."""
    zero_head = _closed(lambda v: jnp.zeros(3) @ jnp.ones((3, 6)) * v[0] * 0.0 + 0.5)
    c = check_values(zero_head, zero_head, X)
    assert c.verdict == "not established" and c.vacuous == [0]
    assert "the same on all 3 inputs" in c.why_not_established()
    both = _closed(lambda v: (jnp.sin(v), v * 0.0))
    assert check_values(both, both, X).vacuous == [1]


def test_no_outputs_is_a_clear_error():
    with pytest.raises(MlsysError, match="returns no outputs"):
        check_values(_closed(lambda v: None), _closed(lambda v: None), X)


def test_stateful_rng_gets_the_same_draws_in_both_programs():
    """lax.rng_uniform draws other values on every run (XLA's hidden state): unchanged, the
    program still verifies, its draws given alike; inside a loop they cannot be, so the output
    is named and not compared."""
    noisy = _closed(lambda v: v + lax.rng_uniform(0.0, 1.0, (6,)))
    assert check_values(noisy, noisy, X).verdict == "yes"
    looped = _closed(lambda v: lax.scan(lambda c, _: (c + lax.rng_uniform(0.0, 1.0, (6,)), None),
                                        v, None, length=2)[0])
    c = check_values(looped, looped, X)
    assert c.verdict == "not established" and "inside a loop" in c.uncompared[0]


def test_fresh_inputs_are_drawn_like_the_example():
    rng = np.random.default_rng(3)
    floats = jnp.asarray(10.0 + 2.0 * rng.standard_normal((200,)), jnp.float32)
    ints = jnp.asarray(rng.integers(-5, 6, (50,)), jnp.int32)
    mask = jnp.asarray(rng.random(100) < 0.25)
    key = jax.random.key(0)
    sets = input_sets([floats, ints, mask, key], fresh=2)
    assert len(sets) == 3 and sets[0][0] is floats
    for f, i, m, k in sets[1:]:
        assert f.dtype == floats.dtype and f.shape == floats.shape
        assert abs(float(np.mean(f)) - 10.0) < 1.0 and 1.0 < float(np.std(f)) < 3.0
        assert i.dtype == ints.dtype and int(np.min(i)) >= -5 and int(np.max(i)) <= 5
        assert m.dtype == mask.dtype and 0.05 < float(np.mean(m)) < 0.5
        assert not np.array_equal(jax.random.key_data(k), jax.random.key_data(key))
    assert not np.array_equal(sets[1][0], sets[2][0])
