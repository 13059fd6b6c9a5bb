"""A pipelined layout: compiled on shapes by the pipeline path (the scanned Llama's layer stack cut
per layer), its split written into the layout, and the layout validated by running it (exact)."""
import os
import sys

import jax
import pytest

from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.shard.layout import make_layout
from mlsys_jax.planning import layout_file
from mlsys_jax.planning.assess import Assessed, estimate_memory
from mlsys_jax.planning.candidates import Candidate
from mlsys_jax.planning.facts import gather_facts
from mlsys_jax.ir.abstract import shapes_of
from mlsys_jax.planning.search import _compile_pipeline
from mlsys_jax.planning.validate import validate

pytestmark = pytest.mark.slow   # a pipeline compiled and run: tens of seconds

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples"))


def test_a_pipeline_is_compiled_on_shapes_and_its_layout_runs_exact():
    with jax.enable_x64(False):       # the user's model runs under JAX's defaults, as the CLI's
        _pipeline_case()


def _pipeline_case():
    import flax_llama as m

    loss_fn, params, batch, opt = m.train(m.replace(m.TINY, batch=8))
    facts = gather_facts(loss_fn, shapes_of(params), shapes_of(batch), opt)
    a = Assessed(Candidate(data=4, model=1, pipe=2, zero=0, microbatches=2, schedule="1f1b"))
    estimate_memory(a, facts, make_layout(facts.trainable, opt, facts.batch,
                                          make_mesh({"data": 4}), 0))
    per_device, collectives = _compile_pipeline(facts, a, "h100")
    assert a.split == ["layers[1]"]                # two layers of an nn.scan stack, one a stage
    assert per_device["total_bytes"] > per_device["param_bytes"] > 0
    assert {r["kind"] for r in collectives} >= {"collective-permute"}
    layout = layout_file.to_data(mesh=a.candidate.shard_mesh, zero=0, param_specs={},
                                 remat=a.candidate.remat,
                                 pipeline={"stages": 2, "microbatches": 2, "schedule": "1f1b",
                                           "split": a.split})
    v = validate(layout, loss_fn, params, batch, opt, target="tiny llama", steps=1)
    assert v.exact, v.reason
    assert v.bytes_equal is None                   # said: not compared for a pipeline
