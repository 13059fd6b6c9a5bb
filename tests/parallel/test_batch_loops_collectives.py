"""The batch-axis walk through what ``vmap`` makes of per-example loops and named collectives, and
through scatters (issue #39): each separable case has no mixing record, each control names the
equation that mixes, and the gradients agree or differ accordingly."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.parallel.shard.batch.explain import causes_of
from mlsys_jax.parallel.shard.batch.rules import follow_batch
from mlsys_jax.parallel.shard.compare import Judgement

B, F = 8, 4
X = jnp.asarray(np.random.default_rng(0).uniform(1.0, 9.0, (B, F)), jnp.float32)
P = {"w": jnp.full((F,), 0.5, jnp.float32)}


def walk(loss, batch):
    closed = jax.make_jaxpr(loss)(P, batch)
    invars = set(closed.jaxpr.invars[len(jax.tree.leaves(P)):])
    return follow_batch(closed, invars, B)


def _newton(a):
    """sqrt(a) by Newton's method, until this example converges."""
    def cond(c):
        return jnp.any(jnp.abs(c[0] * c[0] - a) > 1e-4) & (c[1] < 50)
    return jax.lax.while_loop(cond, lambda c: (0.5 * (c[0] + a / c[0]), c[1] + 1), (a, 0))[0]


def per_example_while(p, b):
    return jnp.mean(jax.vmap(_newton)(b["x"] * p["w"] ** 2 + 1.0) ** 2)


def batch_wide_while(p, b):
    a = b["x"] * p["w"] ** 2 + 1.0
    x = jax.lax.while_loop(lambda x: jnp.any(jnp.abs(x * x - a) > 1e-2),   # every row steps
                           lambda x: 0.5 * (x + a / x) - 1e-3, a)
    return jnp.mean(x ** 2)


def vmapped_batchnorm(p, b):
    def one(x):
        mean = jax.lax.pmean(x, "batch")                       # psum with axes=(0,) once traced
        return (x - mean) * p["w"]
    return jnp.mean(jax.vmap(one, axis_name="batch")(b["x"]) ** 2)


def vmapped_mean_of_loss(p, b):
    """A named collective over a per-example *loss*: the final mean, linear, allowed."""
    return jax.vmap(lambda x: jax.lax.pmean(jnp.sum((x * p["w"]) ** 2), "batch"),
                    axis_name="batch")(b["x"])[0]


def stages_stored(p, b):
    """A Runge-Kutta solver's stage buffer under vmap: ks.at[j].set(k) per example."""
    def one(x):
        ks = jnp.zeros((3, F))
        for j in range(3):
            ks = ks.at[j].set(jnp.tanh(x * p["w"] * (j + 1)))
        return ks.sum()
    return jnp.mean(jax.vmap(one)(b["x"]) ** 2)


def scattered_over_rows(p, b):
    """Control: each example's value written at a row the indices choose (a permutation)."""
    h = jnp.tanh(b["x"] * p["w"])
    out = jnp.zeros_like(h).at[jnp.array([1, 0, 3, 2, 5, 4, 7, 6])].set(h)
    return jnp.mean(out[:, 0] * jnp.arange(B))


def test_a_per_example_while_loop_runs_each_examples_own_trips():
    w = walk(per_example_while, {"x": X})
    assert w.mixing == [] and type(w.output).__name__ == "Summed"


def test_a_loop_stepping_every_row_until_all_converge_is_control_mixing():
    w = walk(batch_wide_while, {"x": X})
    kinds = {m.kind for m in w.mixing}
    assert "control" in kinds and any(m.primitive == "while" for m in w.mixing)


def test_vmapped_pmean_is_the_batch_statistic_it_is():
    w = walk(vmapped_batchnorm, {"x": X})
    assert [(m.kind, m.primitive) for m in w.mixing] == [("statistic", "psum")]
    assert "psum over the batch axis" in w.mixing[0].detail


def test_vmapped_pmean_of_the_loss_is_the_final_mean():
    w = walk(vmapped_mean_of_loss, {"x": X})
    assert w.mixing == [] and type(w.output).__name__ == "Summed"


def test_stage_buffers_written_per_example_keep_the_rows():
    w = walk(stages_stored, {"x": X})
    assert w.mixing == [] and type(w.output).__name__ == "Summed"


def test_a_scatter_to_rows_the_indices_choose_is_selection():
    w = walk(scattered_over_rows, {"x": X})
    assert [(m.kind, m.primitive) for m in w.mixing][:1] == [("selection", "scatter")]


@pytest.mark.parametrize("loss, separable", [(vmapped_batchnorm, False),
                                             (stages_stored, True)])
def test_the_gradients_agree_exactly_where_the_walk_says(loss, separable):
    whole = jax.grad(loss)(P, {"x": X})["w"]
    shards = jax.tree.map(lambda a, b: (a + b) / 2, jax.grad(loss)(P, {"x": X[:4]}),
                          jax.grad(loss)(P, {"x": X[4:]}))["w"]
    assert bool(np.allclose(whole, shards, rtol=1e-5, atol=1e-6)) is separable


def test_unfollowed_records_never_sit_beside_no_equation_mixes():
    """Gradients differ and the walk stopped at an unfollowed equation: the reason says the
    mixing is at or after it, not that no equation mixes."""
    w = walk(vmapped_batchnorm, {"x": X})
    w.mixing[0] = type(w.mixing[0])("unfollowed", "psum", "7", "", "no rule")
    grads = Judgement()
    grads.add([0.3], [0.0], [1.0], 1e-7)
    causes, notes, _ = causes_of(w, False, False, grads, 0, None)
    text = " ".join(causes)
    assert "no equation mixes" not in text and "at or after" in text and "psum at 7" in text
