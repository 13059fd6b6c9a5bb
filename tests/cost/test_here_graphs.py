"""``--hw here`` and the kernels XLA runs as one graph (a YNNPACK fusion of several
contractions): the run of the model's kernels it covers is compiled and timed as one program, and
its time replaces theirs. Which graphs XLA makes depends on the CPU, so the compiled program is
given here as HLO text naming two convolutions in one fusion. And each model object is its own
``here``: two on one cache file do not time with each other's entries."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from mlsys_jax import cost, ir
from mlsys_jax.cost.here import OperatorModel, here_hardware
from mlsys_jax.cost.here import graphs as G
from mlsys_jax.cost.here.dispatch import DispatchCost
from mlsys_jax.cost.here.operators import SideWork

F32 = jnp.float32
DISPATCH = DispatchCost(call_us=5.0, per_input_us=0.3, per_output_us=1.0, per_kernel_us=0.4)
HLO = """%fused_computation (p0: f32[2,8,8,3], p1: f32[3,3,3,4], p2: f32[3,3,4,4]) -> f32[2,8,8,4] {
  %c0 = f32[2,8,8,4]{3,2,1,0} convolution(%p0, %p1), window={size=3x3 pad=1_1x1_1}
  %c1 = f32[2,8,8,4]{3,2,1,0} convolution(%c0, %p2), window={size=3x3 pad=1_1x1_1}
}

ENTRY %main (a: f32[2,8,8,3]) -> f32[2,8,8,4] {
  ROOT %ynn_fusion = f32[2,8,8,4]{3,2,1,0} fusion(%a, %b, %c), kind=kCustom, calls=%fused_computation
}
"""


@pytest.fixture(autouse=True, scope="module")
def cache_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


def cnn(x, w1, w2):
    conv = lambda x, w: lax.conv_general_dilated(  # noqa: E731
        x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jnp.tanh(conv(jnp.maximum(conv(x, w1), 0.0), w2)).sum()


def traced():
    shapes = [(2, 8, 8, 3), (3, 3, 3, 4), (3, 3, 4, 4)]
    return ir.trace(cnn, *(jax.ShapeDtypeStruct(s, F32) for s in shapes))


def model_at(path) -> OperatorModel:
    model = OperatorModel(path, repeats=2, min_time_s=2e-4, progress=False)
    model.entries["dispatch"] = DISPATCH.to_dict()
    return model


def test_a_graph_of_two_convolutions_is_matched_to_the_run_of_kernels_it_covers():
    closed = traced()
    raw = cost.kernels(closed, fused=True, hw="here")
    assert G.fused_graphs(HLO) == [["f32[2,8,8,4]", "f32[2,8,8,4]"]]
    (span,) = G.spans(HLO, raw)
    convs = [i for i, k in enumerate(raw) if "conv_general_dilated" in k.primitives]
    assert span == range(convs[0], len(raw))  # through the work after the last contraction
    assert G.spans(HLO.replace("f32[2,8,8,4]{3", "f32[2,8,8,5]{3"), raw) == []  # no match
    program = G.span_program(raw, span, {}, set(closed.jaxpr.outvars))
    assert program.n_inputs == 3 and program.n_outputs == 1 and not program.unmeasurable


def test_the_graphs_time_replaces_its_kernels_and_only_with_a_compiled_program(tmp_path):
    closed = traced()
    model = model_at(tmp_path / "ops.json")
    hw = here_hardware(model)
    alone = cost.estimate(closed, hw=hw)  # no compiled program at hand: kernels alone
    model.side = SideWork(lambda: SimpleNamespace(as_text=lambda: HLO))
    raw = cost.kernels(closed, fused=True, hw=hw)
    ((span, program),) = model.graphs(closed, raw)
    joint = cost.estimate(closed, hw=hw)
    graph_us = model.entries["kernel:" + program.key]["us"]  # measured now, cached
    members = joint.kernels[span.start:span.stop]
    run = graph_us - DISPATCH.call(program.n_inputs, program.n_outputs)
    assert sum(k.run_us for k in members) == pytest.approx(max(run, 0.0))
    assert all("one graph" in k.why and k.model in ("measured", "cached") for k in members)
    rest = [i for i in range(len(raw)) if i not in span]
    assert [joint.kernels[i].time_us for i in rest] == [alone.kernels[i].time_us for i in rest]
    unfused = cost.estimate(closed, hw=hw, fused=False)  # eager: one call per op, no graph
    assert not any("one graph" in k.why for k in unfused.kernels)


def test_each_model_object_is_its_own_here(tmp_path):
    first, second = model_at(tmp_path / "ops.json"), model_at(tmp_path / "ops.json")
    assert here_hardware(first).timer is first and here_hardware(second).timer is second
    assert here_hardware(first) is here_hardware(first)
    cost.estimate(traced(), hw=here_hardware(first))
    later = model_at(tmp_path / "ops.json")  # reads what the first wrote
    again = cost.estimate(traced(), hw=here_hardware(later))
    assert later.measured_now == 0 and {k.model for k in again.kernels} == {"cached"}
