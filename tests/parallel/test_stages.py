"""The one ZeRO table (parallel/stages.py): its formula is what the lecture's compiled step holds
per device and what the shard layout reports, at every stage."""
import jax
import numpy as np
import optax
import pytest

from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import comm, make_mesh, stages
from mlsys_jax.parallel.lecture import data, zero
from mlsys_jax.parallel.shard.layout import make_layout

N = 4


def test_stage_k_splits_the_first_k_parts():
    parts = lambda s: (s.optimizer, s.grads, s.params)
    assert stages.STAGE_NUMBERS == tuple(range(len(stages.STAGES)))
    for s in stages.STAGES:
        assert parts(s) == tuple(i < s.number for i in range(len(parts(s))))
        assert stages.zero_stage(s.number) is s and s.what


def test_the_cli_offers_the_tables_stages():
    import argparse

    from mlsys_jax.cli.commands import shard

    parser = argparse.ArgumentParser()
    shard.add_arguments(parser)
    zero_flag = next(a for a in parser._actions if "--zero" in a.option_strings)
    assert tuple(zero_flag.choices) == stages.STAGE_NUMBERS


@pytest.fixture(scope="module")
def lecture():
    mesh = make_mesh({"data": N})
    params, x, y = data.demo_problem(seed=5, batch=16, sizes=(5, 7, 3))  # Ψ = 66: padded to 68
    batch = data.pad_shards(x, y, data.even_counts(16, N))
    return mesh, params, optax.adam(0.1), batch


@pytest.mark.slow
@pytest.mark.parametrize("stage", stages.STAGE_NUMBERS)
def test_the_formula_is_what_the_lectures_step_holds(lecture, stage):
    mesh, params, opt, batch = lecture
    zs = zero.make_zero_step(mlp_loss, opt, params, mesh, stage)
    flat, state = zs.init(params)
    xs, ys, ms = data.shard_batch(mesh, "data", *batch)
    _, compiled = comm.compile_and_run(zs.step, flat, state, xs, ys, ms)
    itemsize = np.dtype(flat.dtype).itemsize
    full = zs.padded * itemsize
    f = stages.per_device_bytes(stage, full, full, 2 * full, N)   # Adam: m and v
    scalars = sum(np.dtype(a.dtype).itemsize for a in jax.tree.leaves(state) if a.ndim == 0)
    measured = zero.measure(compiled)
    # the step's arguments: its parameters and optimizer state as the stage keeps them, a batch shard
    assert measured["arguments"] == f["params"] + f["optimizer"] + scalars + comm.nbytes(batch) // N
    want = zero.expected_bytes(stage, zs.padded, N, itemsize, state, comm.nbytes(batch), itemsize)
    assert measured["outputs"] == want["outputs"]
    assert {k: want[k] for k in f} == f


@pytest.mark.parametrize("stage", stages.STAGE_NUMBERS)
def test_the_formula_is_what_the_shard_layout_reports(stage):
    mesh = make_mesh({"data": N})
    rng = np.random.default_rng(0)
    trainable = {"w": rng.standard_normal((8, 4)), "b": rng.standard_normal(4)}  # N divides all
    batch = {"x": rng.standard_normal((16, 8))}
    opt = optax.adam(0.1)
    lay = make_layout(trainable, opt, batch, mesh, stage)
    psi = sum(x.nbytes for x in jax.tree.leaves(trainable))
    count = sum(x.dtype.itemsize for x in jax.tree.leaves(lay.opt_shapes) if x.ndim == 0)  # Adam's
    f = stages.per_device_bytes(stage, psi, psi, 2 * psi, N, optimizer_whole=count)
    assert {k: lay.formula[k] for k in f} == f
    # every leaf splits, so what the layout holds is the formula, part by part
    assert lay.unsplit == () and {k: lay.held[k] for k in f} == f
