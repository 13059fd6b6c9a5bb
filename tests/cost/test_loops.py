"""A while loop's body counts once per trip where literals fix the trip count; otherwise the
report says how many loops make its FLOPs a lower bound."""
import jax
import jax.numpy as jnp
import pytest

from mlsys_jax.cost import estimate
from mlsys_jax.cost.loops import static_trips


def _loop(start, cond, step):
    return lambda x: jax.lax.while_loop(lambda c: cond(c[0]), lambda c: (c[0] + step, c[1] * 2.0),
                                        (start, x))[1]


@pytest.mark.parametrize("start, cond, step", [
    (0, lambda i: i < 10, 1), (10, lambda i: i > 0, -1), (0, lambda i: i <= 9, 2),
    (0, lambda i: i != 9, 3), (5, lambda i: i < 3, 1), (0, lambda i: 7 > i, 2)])
def test_the_trip_count_fixed_by_literals_is_the_one_python_runs(start, cond, step):
    i, trips = start, 0
    while cond(i):
        i, trips = i + step, trips + 1
    eqn = jax.make_jaxpr(_loop(start, cond, step))(jnp.ones(3)).eqns[0]
    assert static_trips(eqn) == trips


def test_a_loop_that_never_ends_or_depends_on_a_traced_bound_has_no_trip_count():
    never = jax.make_jaxpr(_loop(0, lambda i: i != 10, 3))(jnp.ones(3)).eqns[0]
    traced = jax.make_jaxpr(lambda x, n: jax.lax.fori_loop(0, n, lambda i, c: c * 2.0, x))(
        jnp.ones(3), 4).eqns[0]
    assert static_trips(never) is None and static_trips(traced) is None


def test_flops_count_the_body_per_trip_and_a_report_names_loops_it_could_not_count():
    body = lambda c: (c[0] + 1, jnp.sin(c[1]) @ c[1])  # noqa: E731
    once = estimate(jax.make_jaxpr(lambda x: body((0, x))[1])(jnp.ones((8, 8))))
    looped = estimate(jax.make_jaxpr(
        lambda x: jax.lax.while_loop(lambda c: c[0] < 10, body, (0, x))[1])(jnp.ones((8, 8))))
    assert looped.total_flops == 10 * once.total_flops + 11 * 1 + 10 * 1  # cond lt, counter add
    assert looped.uncounted_loops == 0
    traced = estimate(jax.make_jaxpr(lambda x, n: jax.lax.fori_loop(
        0, n, lambda i, c: jnp.sin(c) @ c, x))(jnp.ones((8, 8)), 3))
    assert traced.uncounted_loops == 1


def test_inspect_says_when_its_flops_are_a_lower_bound(tmp_path, capsys):
    import json

    from mlsys_jax import cli

    path = tmp_path / "loops.py"
    path.write_text("import jax, jax.numpy as jnp\n"
                    "def solve(x, n):\n"
                    "    return jax.lax.fori_loop(0, n, lambda i, c: jnp.sin(c) @ c, x)\n"
                    "def fixed(x):\n"
                    "    return jax.lax.while_loop(lambda c: c[0] < 4, lambda c: (c[0] + 1, "
                    "jnp.sin(c[1]) @ c[1]), (0, x))[1]\n")
    args = ["--devices", "8", "inspect", "--no-xla", "--json"]
    assert cli.main([*args, f"{path}:solve", "--arg", "f32[8,8]", "--arg", "i32[]"]) == 0
    assert json.loads(capsys.readouterr().out)["uncounted_loops"] == 1
    assert cli.main(["--devices", "8", "inspect", "--no-xla", f"{path}:solve", "--arg",
                     "f32[8,8]", "--arg", "i32[]"]) == 0
    assert "FLOPs are a lower bound: 1 while loop(s)" in capsys.readouterr().out
    assert cli.main([*args, f"{path}:fixed", "--arg", "f32[8,8]"]) == 0
    assert json.loads(capsys.readouterr().out)["uncounted_loops"] == 0
