"""Targets as users write them: example factories (pytrees with static leaves, PRNG keys, Python
scalars), JAX's float32 defaults unless --x64, the unfused and fused estimates side by side, and
optimize's value check (verified only when the outputs agree; tests/passes/test_value_check.py)."""
import json
import textwrap

import jax
import pytest

from mlsys_jax import cli
from mlsys_jax.cli.target import load_factory
from mlsys_jax.passes import registry

USER_FILE = textwrap.dedent("""
    import jax, jax.numpy as jnp

    class Layer:                      # a module-like pytree: arrays and static leaves
        def __init__(self, w, name, act):
            self.w, self.name, self.act = w, name, act

    jax.tree_util.register_pytree_node(
        Layer, lambda m: ((m.w, m.name, m.act), None), lambda _, c: Layer(*c))

    def forward(params, x, key, rate):
        keep = jax.random.bernoulli(key, 1 - rate, x.shape)     # dropout: an RNG primitive
        h = params["layer"].act(jnp.where(keep, x, 0) @ params["layer"].w)
        return h * params["scale"], params["layer"].name       # a static output leaf too

    def make():
        params = {"layer": Layer(jnp.ones((16, 8)) / 4, "dense", jax.nn.relu),
                  "scale": jnp.full((8,), 2.0)}
        return forward, (params, jnp.ones((4, 16)), jax.random.key(0), 0.25)

    def powers():
        return (lambda p, x: x ** 2 + x ** 3 * p), (jnp.float32(1.0), jnp.linspace(-2, 2, 8))

    def needs_args(x):
        return x

    def not_a_tuple():
        return 3

    def args_not_tuple():
        return (lambda x: x), jnp.ones(3)

    def broken():
        raise ValueError("no weights file")

    def none_output():
        return (lambda p: None), (jnp.ones(3),)
""")


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "factories.py"
    path.write_text(USER_FILE)
    return str(path)


def _run(argv, capsys):
    rc = cli.main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_factory_inspect_traces_arrays_and_keeps_static_leaves(user_file, capsys):
    rc, out, _ = _run(["inspect", f"{user_file}:make", "--json"], capsys)
    assert rc == 0
    d = json.loads(out)
    names = [op["name"] for op in d["ops"]]
    assert "matmul" in names and d["unknown"] == []
    assert d["total"]["kernels"] >= d["total"]["fused_kernels"] >= 2
    assert "random_bits" in d["primitives"]


def test_factory_grad_includes_the_weight_gradients(user_file, capsys):
    forward = json.loads(_run(["inspect", f"{user_file}:make", "--json"], capsys)[1])
    rc, out, _ = _run(["inspect", f"{user_file}:make", "--grad", "--json"], capsys)
    grad = json.loads(out)
    assert rc == 0 and grad["primitives"]["dot_general"] >= 2  # forward and the weight gradient
    assert grad["total"]["flops"] >= forward["total"]["flops"] + 2 * 4 * 16 * 8  # + x^T @ g


def test_factory_optimize_keeps_the_key_and_verifies(user_file, capsys):
    rc, out, _ = _run(["optimize", f"{user_file}:make", "--json"], capsys)
    d = json.loads(out)
    assert rc == 0 and d["verified"] and d["max_abs_diff"] == 0 and d["problems"] == []
    assert d["before"]["primitives"]["random_bits"] == d["after"]["primitives"]["random_bits"]
    assert {"fused_kernels", "fused_time_us"} <= set(d["before"]) and "measured" not in d


def test_user_code_runs_in_float32_unless_x64(user_file, capsys):
    assert jax.config.jax_enable_x64  # the test session's own setting, for the lecture
    _, text, _ = _run(["inspect", f"{user_file}:make"], capsys)
    assert "native dtypes: f32" in text and "f64" not in text
    _, text, _ = _run(["inspect", f"{user_file}:make", "--x64"], capsys)
    assert "native dtypes: f64" in text
    assert jax.config.jax_enable_x64  # the command left the process as it found it


def test_text_shows_both_estimates_and_which_the_compiler_resembles(user_file, capsys):
    _, text, _ = _run(["inspect", f"{user_file}:make"], capsys)
    assert "estimate: one kernel per op:" in text and "· fused (" in text
    assert "resembles the fused estimate" in text


@pytest.mark.parametrize("name, message", [
    ("needs_args", "one --arg SPEC"),
    ("not_a_tuple", "must return (f, args); got a int"),
    ("args_not_tuple", "args a tuple of example arguments"),
    ("broken", "factory .*:broken failed: ValueError: no weights file"),
])
def test_factory_errors_are_one_line(user_file, capsys, name, message):
    rc, _, err = _run(["inspect", f"{user_file}:{name}"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert __import__("re").search(message.replace("(", r"\(").replace(")", r"\)")
                                   if "*" not in message else message, err)


def test_inputs_that_cannot_fit_are_refused_before_allocating(user_file, capsys):
    rc, _, err = _run(["optimize", f"{user_file}:needs_args", "--arg",
                       "f32[1000000000,1000000000]"], capsys)
    assert rc == 2 and "available on this machine" in err and len(err.strip().splitlines()) == 1


def test_grad_of_a_function_returning_none_is_a_clear_error(user_file, capsys):
    rc, _, err = _run(["inspect", f"{user_file}:none_output", "--grad"], capsys)
    assert rc == 2 and "needs a float array as" in err


def test_load_factory_checks_the_tuple_it_expects(user_file):
    f, args, third, fourth = load_factory(f"{user_file}:make", "(f, args[, a[, b]])")
    assert callable(f) and len(args) == 4 and third is None and fourth is None
    with pytest.raises(ValueError, match=r"must return \(loss_fn, params, batch\[, optimizer"):
        load_factory(f"{user_file}:powers", "(loss_fn, params, batch[, optimizer[, rules]])")


def test_optimize_that_changes_values_is_not_verified(user_file, capsys, monkeypatch):
    # a deliberately broken CSE that ignores params merges x**2 and x**3: types still agree,
    # so only the value check can catch it
    monkeypatch.setattr(registry, "pipeline",
                        lambda spec=None, source="": registry.make("cse", param_blind=True))
    rc, out, _ = _run(["optimize", f"{user_file}:powers"], capsys)
    assert rc == 1 and "verified: no — output 0 on input 0:" in out
    rc, out, _ = _run(["optimize", f"{user_file}:powers", "--json"], capsys)
    d = json.loads(out)
    assert rc == 1 and not d["verified"] and d["wrong_elements"] > 0


@pytest.mark.slow
def test_measure_reports_both_times_and_the_speedup(user_file, capsys):
    rc, out, _ = _run(["optimize", f"{user_file}:make", "--measure", "--rounds", "2", "--json"],
                      capsys)
    m = json.loads(out)["measured"]
    assert rc == 0 and set(m) == {"original_us", "optimized_us", "speedup", "speedup_min",
                                  "speedup_max", "rounds", "original_predicted_us",
                                  "optimized_predicted_us"}
    assert m["rounds"] == 2 and m["original_us"] > 0 and m["speedup_min"] <= m["speedup"]
