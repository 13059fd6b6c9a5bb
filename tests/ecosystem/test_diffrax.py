"""diffrax as shipped: an adaptive Tsit5 solve of a small MLP vector field, vmapped over
per-example initial states. The batch-axis walk follows it to the final mean (equinox's ``vprim``,
``select_if_vmap`` and stage scatters are per example; its ``unvmap_any`` flags, which run the
loop until every example is done, are left to the gradients and named in a note), so
``shard --mesh data=2`` says exact: yes; ``inspect`` calls its FLOPs a lower bound (two while
loops of unknown trip count, each body counted once); and a precondition the user checks with
``eqx.error_if``, which the value check's fresh inputs break, is the user's failure (exit 2, the
user's line), not a bug of ours (exit 70). The module's factories are the CLI's targets."""
import inspect as pyinspect
import os

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
import optax
import pytest

from mlsys_jax import cli
from mlsys_jax.cost.loops import static_trips
from mlsys_jax.ir import walk as ir_walk
from mlsys_jax.parallel import ShardOptions, comm, simulate
from mlsys_jax.parallel.shard.batch.flags import FLAGS
from mlsys_jax.parallel.shard.batch.rules import follow_batch

HERE = os.path.abspath(__file__)
ROWS, DIM = 8, 4


class Field(eqx.Module):
    mlp: eqx.nn.MLP

    def __call__(self, t, y, args):
        return self.mlp(y)


def _solve(field, y0):
    sol = diffrax.diffeqsolve(diffrax.ODETerm(field), diffrax.Tsit5(), t0=0.0, t1=1.0, dt0=0.1,
                              y0=y0, stepsize_controller=diffrax.PIDController(rtol=1e-3,
                                                                               atol=1e-5))
    return sol.ys[-1]


def _field():
    return Field(eqx.nn.MLP(DIM, DIM, 16, 2, activation=jnp.tanh, key=jax.random.key(0)))


def _batch():
    k1, k2 = jax.random.split(jax.random.key(1))
    return {"y0": jax.random.normal(k1, (ROWS, DIM)), "target": jax.random.normal(k2, (ROWS, DIM))}


def loss_fn(field, batch):
    y1 = jax.vmap(_solve, in_axes=(None, 0))(field, batch["y0"])
    return jnp.mean((y1 - batch["target"]) ** 2)


def train():
    return loss_fn, _field(), _batch(), optax.adam(1e-3)


def solve_all(field, y0):
    return jax.vmap(_solve, in_axes=(None, 0))(field, y0)


def solves():
    return solve_all, (_field(), _batch()["y0"])


def non_negative(field, y0):
    y0 = eqx.error_if(y0, y0 < 0, "y0 must be non-negative")   # PRECONDITION
    return jax.vmap(_solve, in_axes=(None, 0))(field, y0)


def checked_solves():
    """Non-negative example states; the value check's fresh draws (each array's mean and
    spread) are not."""
    return non_negative, (_field(), jnp.abs(_batch()["y0"]))


def _closed():
    params, static = eqx.partition(_field(), eqx.is_array)
    batch = _batch()
    closed = jax.make_jaxpr(lambda p, b: loss_fn(eqx.combine(p, static), b))(params, batch)
    return closed, set(closed.jaxpr.invars[len(jax.tree.leaves(params)):])


@pytest.mark.slow
def test_the_walk_follows_the_solve_to_the_final_mean():
    closed, invars = _closed()
    w = follow_batch(closed, invars, ROWS)
    assert type(w.output).__name__ == "Summed"
    assert w.mixing and {m.kind for m in w.mixing} == {"unfollowed"}
    assert {m.primitive for m in w.mixing} <= set(FLAGS)
    whiles = [e for _, e in ir_walk(closed) if e.primitive.name == "while"]
    assert whiles and all(static_trips(e) is None for e in whiles)


@pytest.mark.slow
def test_shard_on_a_data_mesh_is_exact_and_names_the_flags():
    r = simulate(loss_fn, _field(), _batch(), optax.adam(1e-3), {"data": 2}, ShardOptions(
        steps=1, xla_options=comm.FAST_COMPILE, time_repeats=0))
    assert r.exact and "separable loss" in r.reason and "4 points" in r.reason
    assert any("batch-wide flag" in n and "the gradients decide" in n for n in r.notes)


@pytest.mark.slow
def test_inspect_calls_the_flops_a_lower_bound(capsys):
    code = cli.main(["--devices", "8", "inspect", f"{HERE}:solves", "--no-xla"])
    out = capsys.readouterr().out
    assert code == 0
    assert "FLOPs are a lower bound: 2 while loop(s) of unknown trip count" in " ".join(out.split())


@pytest.mark.slow
def test_a_broken_precondition_in_the_value_check_is_the_users_failure(capsys):
    code = cli.main(["--devices", "8", "optimize", f"{HERE}:checked_solves"])
    err = capsys.readouterr().err
    lines, start = pyinspect.getsourcelines(non_negative)
    line = start + next(i for i, t in enumerate(lines) if "PRECONDITION" in t)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("mlsys-jax: error: a check in your code failed")
    assert f"test_diffrax.py:{line}" in last and "y0 must be non-negative" in last
    assert "value check" in last and "bug in mlsys-jax" not in err and "Traceback" not in err
