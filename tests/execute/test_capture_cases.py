"""Capture cases where compiled replay could differ from eager JAX, crash, or grow without bound
(lecture §8.4).

Each case is called through one ``capture`` wrapper several times — cold (the Python runs), warm
(segment by segment) and replayed as one program — and every result must equal eager bitwise:
values, dtypes and weak types (``fuzz.capture_oracle.compare``). Where capture cannot keep a case
exact it must fall back to eager and say why in ``explain()``.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.execute import capture, explain
from mlsys_jax.execute.capture.exact_programs import MAX_PROGRAM_OPS
from mlsys_jax.execute.capture.guard_tree import MAX_GUARD_VALUES
from mlsys_jax.execute.capture import MAX_SIGNATURES
from mlsys_jax.fuzz.capture_oracle import compare
from mlsys_jax.models.branchy import two_breaks

F32 = jnp.float32


def same_as_eager(fn, *arg_sets, calls=3):
    """Call ``capture(fn)`` ``calls`` times per argument set, in turn; all equal eager."""
    c = capture(fn)
    for _ in range(calls):
        for args in arg_sets:
            diff = compare(c(*args), fn(*args))
            assert diff is None, diff
    return c


# --- guards and static arguments tell -0.0 from 0.0 -----------------------------------------

def test_static_float_argument_keeps_its_sign():
    x = jnp.array([1.0, 2.0], F32)
    c = same_as_eager(lambda x, s: 1.0 / (x * s), (x, 0.0), (x, -0.0))
    assert np.isneginf(np.asarray(c(x, -0.0))).all()


@pytest.mark.parametrize("read", [lambda v: float(v[0]), lambda v: v[0].item(),
                                  lambda v: v.tolist()[0]], ids=["float", "item", "tolist"])
def test_guard_on_a_signed_zero(read):
    def f(x):
        return 1.0 / (x * 0 + read(x))  # the guard's value becomes a constant of the next graph

    zero, negzero = jnp.array([0.0, 1.0], F32), jnp.array([-0.0, 1.0], F32)
    same_as_eager(f, (zero,), (negzero,))


def test_bool_guard_of_negative_zero_and_nan():
    def f(x):
        return x * 2 if x[0] else x - 1  # bool(-0.0) is False, bool(nan) True

    same_as_eager(f, (jnp.array([-0.0, 1.0], F32),), (jnp.array([jnp.nan, 1.0], F32),),
                  (jnp.array([0.0, 1.0], F32),))


# --- compiled graphs are not rewritten where that changes results -------------------------

@pytest.mark.slow
@pytest.mark.parametrize("fn", [
    lambda x: 1.0 / (x + 0.0),  # x + 0.0 -> x would keep -0.0
    lambda x: jnp.log(jnp.exp(x)),  # the simplifier's log(exp(x)) -> x
    lambda x: x ** 3.0,  # pow(x, 3) -> x * x * x: last bit on ~25% of elements
    lambda x: x * 3 + 1,  # a fused multiply-add rounds once
    lambda x: jnp.tanh(x) * 3 + 1,
    lambda x: x.reshape(64, 64) @ x.reshape(64, 64).T,  # transpose folded into the dot
    lambda x: x[:, None] @ x[None, :] + 1.0,  # a one-element contraction is a multiply
    lambda x: jnp.var(x) + jax.lax.erfc(x),  # fused inside eager's own program
    lambda x: jax.nn.gelu(x, approximate=False) + jnp.polyval(jnp.array([0.5, -1.0, 2.0]), x),
], ids=["add_zero", "log_exp", "pow3", "fma", "tanh_fma", "transpose_dot", "outer_add",
        "var_erfc", "gelu_polyval"])
def test_compiled_graph_rounds_as_eager(fn):
    x = jnp.linspace(-3.0, 3.0, 4096, dtype=F32).at[0].set(-0.0)
    same_as_eager(fn, (x,))


@pytest.mark.parametrize("fn", [lambda x: 1.0 / (x + 0.0), lambda x: x ** 3.0, lambda x: x * 3 + 1],
                         ids=["add_zero", "pow3", "fma"])
def test_baked_constants_of_the_one_program_replay_round_as_eager(fn):
    # behind a break, the constants are baked into the one program (behind barriers)
    def f(x):
        return fn(x) if x.sum() > 0 else fn(-x)

    x = jnp.linspace(-3.0, 3.1, 4096, dtype=F32).at[0].set(-0.0)
    c = same_as_eager(f, (x,), (-x,))
    assert c.replay_info(x)["one_program"] and c.stats["fused"] > 0
    assert not c.roots[next(iter(c.roots))].fast.consts  # no constant passed as an argument


def test_explain_names_dispatches_that_run_as_eager_programs():
    x = jnp.linspace(-1.0, 1.0, 8, dtype=F32)
    notes = explain(lambda x: jnp.var(x) * x + jax.lax.erfc(x), x).notes
    assert [n.split(":")[1].split()[0] for n in notes] == ["jit[_var]", "erfc"], notes
    assert all("its own XLA program" in n for n in notes)


# --- weak types survive the one-program replay -------------------------------------------

def test_weak_types_through_the_fused_branch_replay():
    def f(x, w):
        r = w * 2 if x.sum() > 0 else w * 3
        return r, r + jnp.float32(1)  # weak r keeps float32; a strong float64 r would promote

    x, w = jnp.ones(3, F32), jnp.asarray(2.0)
    assert w.weak_type
    c = same_as_eager(f, (x, w), (-x, w))
    assert c.replay_info(x, w)["one_program"] and c.stats["fused"] > 0


def test_branches_of_different_weak_types_are_not_one_program():
    def f(x, w):  # the same dtype, weak in one branch and strong in the other
        return w * 2 if x.sum() > 0 else x.sum().astype(w.dtype) * 2

    x, w = jnp.ones(3, F32), jnp.asarray(2.0)
    c = same_as_eager(f, (x, w), (-x, w))
    assert not c.replay_info(x, w)["one_program"]


# --- constants and PRNG keys made inside a captured function ------------------------------

@pytest.mark.parametrize("fn", [
    lambda x: x * jnp.asarray(1.0),
    lambda x: x * jnp.array([1.0, 2.0, 3.0]),
    lambda x: x + jax.random.normal(jax.random.key(0), x.shape, x.dtype),
    lambda x: jax.random.split(jax.random.key(1))[0] if x.sum() > 0 else jax.random.key(2),
    lambda x: x + jax.random.uniform(jax.random.PRNGKey(3), x.shape),
], ids=["asarray", "array", "key", "key_output", "legacy_key"])
def test_constants_and_keys_created_inside(fn):
    x = jnp.array([1.0, -2.0, 3.0], F32)
    c = capture(fn)
    for _ in range(3):
        got, want = c(x), fn(x)
        if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        assert compare(got, want) is None


# --- bounded resources ----------------------------------------------------------------------

def test_guard_that_never_stabilises_falls_back_to_eager():
    def f(x):
        return x * float(x.sum())  # a new guard value (and path) every call

    c = capture(f)
    for i in range(3 * MAX_GUARD_VALUES):
        x = jnp.full(4, i, F32)
        assert compare(c(x), f(x)) is None
    root = next(iter(c.roots.values()))
    assert len(root.node.children) == MAX_GUARD_VALUES  # bounded, not one path per value
    assert c.stats["eager"] >= 2 * MAX_GUARD_VALUES - 1
    e = explain(c, jnp.full(4, 99.0, F32))
    assert "never stabilises" in e.fallback and "float()" in e.fallback
    assert "runs eagerly" in str(e)


def test_too_many_input_signatures_fall_back_to_eager():
    c = capture(lambda x, n: x * n)
    for n in range(MAX_SIGNATURES + 5):
        assert compare(c(jnp.ones(2, F32), n), jnp.ones(2, F32) * n) is None
    assert len(c.roots) == MAX_SIGNATURES and c.stats["eager"] == 5
    assert "input signatures" in explain(c, jnp.ones(2, F32), 999).fallback


@pytest.mark.slow
def test_long_chain_compiles_in_bounded_programs():
    rng = np.random.default_rng(0)
    ops = rng.integers(0, 3, 1100)

    def chain(x):
        for o in ops:
            x = jnp.sin(x) if o == 0 else x * 1.001 if o == 1 else x + 0.5
        return x

    x = jnp.linspace(-1.0, 1.0, 16, dtype=F32)
    e = explain(chain, x)
    assert (e.graph_count, e.graph_break_count) == (1, 0)
    assert any(f"at most {MAX_PROGRAM_OPS}" in n for n in e.notes), e.notes
    same_as_eager(chain, (x,))


# --- several breaks replay as one program ---------------------------------------------------

def test_two_breaks_replay_as_one_program_without_a_guard_read():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((8, 16)), F32)
    w1, w2 = (jnp.asarray(rng.standard_normal((16, 16)), F32) for _ in range(2))
    paths = [(x, w1, w2), (x, w1, -w2), (jnp.abs(x), -jnp.abs(w1), w2),
             (jnp.abs(x), -jnp.abs(w1), -w2)]
    c = capture(two_breaks)
    c(*paths[0])
    c(*paths[0])
    # one outcome of each break known: one program, with a miss flag the host reads
    assert c.replay_info(*paths[0]) == {"one_program": True, "miss_flag": True, "eager": None}
    c = same_as_eager(two_breaks, *paths)
    # every outcome known: no flag, nothing read on the host, one dispatch per call
    assert c.replay_info(*paths[0]) == {"one_program": True, "miss_flag": False, "eager": None}
    assert c.stats["cold"] == 4 and c.stats["fused"] >= 4


# --- a warm call's hot path (the settled tree's program, called directly) --------------------

def test_hot_path_keeps_results_counts_and_refusals():
    k = np.linspace(-1.0, 1.0, 100, dtype=np.float32)  # > 64 elements: a program argument

    def f(x):
        h = x * k
        return (h, h.sum()) if h.sum() > 0 else (jnp.exp(h), h.max())

    x = jnp.linspace(0.0, 1.0, 100, dtype=F32)
    c = same_as_eager(f, (x,), (-x,), calls=4)
    prog = c.roots[next(iter(c.roots))].fast
    assert prog.consts and not prog.bare and c.hot and c.hot_calls > 0
    before, hot = c.stats, c.hot_calls
    assert compare(c(-x), f(-x)) is None
    assert c.hot_calls == hot + 1 and c.stats == {**before, "warm": before["warm"] + 1,
                                                   "fused": before["fused"] + 1}
    with pytest.raises(MlsysError, match="inside the captured function"):
        jax.jit(c)(x)  # a tracer of the same type never takes the hot path
    c(np.asarray(x))  # a new input signature: a cold run drops the hot path ...
    assert not c.hot and c.stats["cold"] == before["cold"] + 1
    for _ in range(3):  # ... until the tree's program is called directly again
        assert compare(c(x), f(x)) is None
    assert c.hot


@pytest.mark.slow
def test_one_value_given_twice_to_max_keeps_eagers_denormal_rounding():
    # eager's max dispatch gets y as two parameters and reads a subnormal as zero; a program
    # that sees max(y, y) folds it to y
    @jax.jit
    def users_max(a, b):
        return jnp.maximum(a, b) * 1.0

    def f(x, y):
        if x.sum() > 0:
            return jnp.maximum(y, y), jax.lax.min(y, y), users_max(y, y)
        return y + 1.0, y - 1.0, y * 2.0

    y = jnp.asarray(np.array([1e-45, -1e-45, 2.0], np.float32))
    x = jnp.ones(3, jnp.float32)
    c = capture(f)
    for args in [(x, y)] * 3 + [(-x, y)] * 3 + [(x, y)] * 2:  # both outcomes, then one program
        diff = compare(c(*args), f(*args))
        assert diff is None, diff
