"""``--hw here``: kernels keyed by their code, measured once and cached, a program costed from its
kernels by the model's formula, the roofline kept (and said) where nothing was measured, and a
search ranked by the model. Timing accuracy is a benchmark figure (``bench passes``); these tests
assert what holds whatever the machine's load."""
import json
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import cost, ir, models
from mlsys_jax.cost.here import OperatorModel, here_hardware
from mlsys_jax.cost.here.dispatch import DispatchCost
from mlsys_jax.errors import MlsysError

F32 = jnp.float32


@pytest.fixture(autouse=True, scope="module")
def cache_home(tmp_path_factory):
    """This machine's 'cpu' calibration (the roofline ``here`` is set against) measured once for
    the module, in a cache of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


DISPATCH = DispatchCost(call_us=5.0, per_input_us=0.3, per_output_us=1.0, per_kernel_us=0.4)


@pytest.fixture
def quick_model():
    """Models with few, short rounds and fixed dispatch figures: these tests check the model's
    bookkeeping, not its accuracy (a benchmark figure)."""
    def make(path, **kw) -> OperatorModel:
        model = OperatorModel(path, repeats=2, min_time_s=2e-4, progress=False, **kw)
        if kw.get("budget_s", 1.0) > 0:
            model.entries.setdefault("dispatch", DISPATCH.to_dict())
        return model
    return make


@pytest.mark.slow
def test_dispatch_overheads_are_measured_and_add_up():
    from mlsys_jax.cost.here.dispatch import measure_dispatch

    d = measure_dispatch(repeats=3, min_time_s=2e-3)
    assert 0 < d.call_us < 1e4 and d.per_input_us >= 0 and d.per_output_us >= 0
    assert d.per_kernel_us >= 0
    assert d.call(4, 2) == pytest.approx(d.call_us + 4 * d.per_input_us + 2 * d.per_output_us)


def mlp(x, w):
    return jnp.tanh(x @ w).sum(axis=0)


def traced(fn=mlp, n=16):
    return ir.trace(fn, jax.ShapeDtypeStruct((n, n), F32), jax.ShapeDtypeStruct((n, n), F32))


def keys(closed, hw="cpu"):
    raw = cost.kernels(closed, fused=True, hw=hw)
    return [p.key for p in OperatorModel.programs(closed, raw)]


def test_kernel_keys_name_the_code_and_not_the_values():
    assert keys(traced()) == keys(traced())  # traced twice: the same kernels
    assert len(set(keys(traced()))) == 2     # the matmul, then tanh and the sum in one loop
    assert keys(traced(n=16))[0] != keys(traced(n=32))[0]  # another shape, another kernel
    w1, w2 = (jnp.asarray(np.random.default_rng(s).standard_normal((16, 16)), F32) for s in (0, 1))
    x = jax.ShapeDtypeStruct((16, 16), F32)
    as_const = [keys(ir.trace(lambda x, w=w: mlp(x, w), x))[0] for w in (w1, w2)]
    assert as_const[0] == as_const[1]  # a large constant by its type: timing ignores values
    assert as_const[0] != keys(traced())[0]  # a constant is not an argument: XLA folds constants
    scaled = [keys(ir.trace(lambda x, s=s: x * jnp.asarray(s, F32), x)) for s in (2.0, 3.0)]
    assert scaled[0] != scaled[1]  # a small constant by value (XLA may simplify it)


def test_each_kernel_is_measured_once_and_the_next_process_reads_the_cache(tmp_path, quick_model):
    closed = traced()
    model = quick_model(tmp_path / "ops.json")
    hw = here_hardware(model)
    first = cost.estimate(closed, hw=hw)
    assert [k.model for k in first.kernels] == ["measured", "measured"]
    assert model.measured_now == 2
    again = cost.estimate(closed, hw=hw)
    assert [k.model for k in again.kernels] == ["cached", "cached"] and model.measured_now == 2
    data = json.loads((tmp_path / "ops.json").read_text())
    assert data["identity"] == model.identity
    assert {"jax", "jaxlib", "platform", "device_kind", "cpu"} <= set(data["identity"])
    assert sorted(k for k in data["entries"] if k.startswith("kernel:")) == sorted(
        "kernel:" + k for k in keys(closed))
    later = quick_model(tmp_path / "ops.json")  # a new process: nothing measured again
    reread = cost.estimate(closed, hw=here_hardware(later))
    assert later.measured_now == 0 and [k.model for k in reread.kernels] == ["cached"] * 2
    assert reread.time_us == pytest.approx(again.time_us)


def test_a_cache_written_elsewhere_is_not_read(tmp_path, quick_model):
    model = quick_model(tmp_path / "ops.json")
    cost.estimate(traced(), hw=here_hardware(model))
    data = json.loads((tmp_path / "ops.json").read_text())
    data["identity"]["jaxlib"] = "0.0.1"  # another jaxlib compiles other code
    (tmp_path / "ops.json").write_text(json.dumps(data))
    assert not any(k.startswith("kernel:") for k in quick_model(tmp_path / "ops.json").entries)


def test_a_program_costs_its_kernels_alone_less_their_calls_plus_one_call(tmp_path, quick_model):
    closed = traced()
    model = quick_model(tmp_path / "ops.json")
    hw = here_hardware(model)
    fused, unfused = (cost.estimate(closed, hw=hw, fused=f) for f in (True, False))
    d = model.dispatch()
    raw = cost.kernels(closed, fused=True, hw=hw)
    for k, p in zip(fused.kernels, OperatorModel.programs(closed, raw)):
        alone = model.entries["kernel:" + p.key]["us"]
        run = max(alone - d.call(p.n_inputs, p.n_outputs), 0.0)
        assert k.run_us == pytest.approx(run)
        assert k.time_us == pytest.approx(run + d.per_kernel_us)
        assert k.bound_us > 0 and (k.efficiency is None or k.efficiency == pytest.approx(
            run / k.bound_us))
    assert fused.overhead_us == pytest.approx(d.call(2, 1))  # one call: 2 arguments, 1 output
    assert fused.time_us == pytest.approx(sum(k.time_us for k in fused.kernels) + d.call(2, 1))
    raw = cost.kernels(closed, fused=False, hw=hw)
    for k, p in zip(unfused.kernels, OperatorModel.programs(closed, raw)):
        assert k.time_us == pytest.approx(model.entries["kernel:" + p.key]["us"])  # eager calls
    assert unfused.overhead_us == 0 and len(unfused.kernels) > len(fused.kernels)


def test_without_a_budget_every_kernel_keeps_the_roofline_and_says_why(tmp_path, quick_model):
    model = quick_model(tmp_path / "ops.json", budget_s=0.0)
    hw = here_hardware(model)
    r = cost.estimate(traced(), hw=hw)
    assert {k.model for k in r.kernels} == {"roofline"}
    assert all("--measure-budget" in k.why and k.run_us is None for k in r.kernels)
    assert r.overhead_us == pytest.approx(hw.launch_s * 1e6)  # the calibrated empty call
    assert not (tmp_path / "ops.json").exists()  # nothing measured, nothing written


def test_a_while_loop_keeps_the_roofline_with_its_reason(tmp_path, quick_model):
    def loop(x):
        return lax.while_loop(lambda c: c[0].sum() < 100.0, lambda c: (c[0] * 2.0 + 1.0,), (x,))

    closed = ir.trace(loop, jax.ShapeDtypeStruct((8,), F32))
    r = cost.estimate(closed, hw=here_hardware(quick_model(tmp_path / "ops.json")))
    (k,) = [k for k in r.kernels if "while" in k.primitives]
    assert k.model == "roofline" and "trip count" in k.why


def test_here_times_the_graphs_own_dtypes(tmp_path, quick_model):
    with pytest.raises(MlsysError, match="own dtypes"):
        cost.estimate(traced(), hw=here_hardware(quick_model(tmp_path / "ops.json")), dtype="bf16")


class FlopClock(OperatorModel):
    """Kernel times from FLOPs (1 µs per MFLOP, plus 1 µs), dispatch fixed: a deterministic
    stand-in for the machine, so the search's use of the model is tested, not the machine."""

    def __init__(self, path):
        super().__init__(path, progress=False)
        self.entries["dispatch"] = DispatchCost(2.0, 0.1, 0.5, 0.2).to_dict()

    def fill(self, closed, kernels, fused, hw):
        programs = self.programs(closed, kernels)
        times = {p.key: (1.0 + k.flops / 1e6, "measured") for k, p in zip(kernels, programs)}
        return self.assemble(closed, kernels, programs, times, fused, hw)


def test_the_search_ranks_by_the_model_and_passes_through_a_slower_step(tmp_path):
    from experiments.s02_graph_opt import block_params
    from mlsys_jax.passes.search import search

    shape = (2, 16, 8, 8)
    closed = ir.trace(partial(models.resnet_block, block_params(shape[1], F32, 0)),
                      jax.ShapeDtypeStruct(shape, F32))
    hw = here_hardware(FlopClock(tmp_path / "ops.json"))
    found = search(closed, hw=hw, dtype=None)  # the default α = 1.05
    rules = [s.rule for s in found.path]
    # enlarging the 1×1 conv to 3×3 costs ~+80% here (FLOPs), more than α allows; merging then
    # leaves one conv: the model's cheapest graph, reached only because α does not prune
    assert rules[-2:] == ["enlarge_conv_kernel", "merge_parallel_convs"], rules
    assert found.best_cost["time_us"] == pytest.approx(cost.estimate(found.best, hw=hw).time_us)
    convs = ir.primitive_counts(found.best)["conv_general_dilated"]
    assert convs == 1


def test_a_figure_is_decided_when_its_first_rounds_pin_the_median():
    """The first 3 of 5 rounds bound the median of all 5 between their lowest and highest: a
    spread within ``DECIDED`` of the median decides it; the rest run the rounds left, and the
    figure is the median of all of them."""
    from mlsys_jax import timing
    from mlsys_jax.cost.here import rounds

    def t(*s):
        return timing.Timing(sorted(s)[len(s) // 2], min(s), max(s), len(s), 7, s)
    assert rounds.decided(t(1.0, 1.02, 1.04))
    assert not rounds.decided(t(1.0, 1.02, 1.2))
    joined = rounds._joined(t(1.0, 1.02, 1.2), t(1.5, 0.9))
    assert (joined.median_s, joined.min_s, joined.max_s, joined.repeats, joined.number) == \
        (1.02, 0.9, 1.5, 5, 7)
    calls = {"a": lambda: 1, "b": lambda: 2}
    out = rounds.timed(calls, repeats=5, min_time_s=1e-4)
    assert all(v.repeats in (3, 5) and len(v.samples) == v.repeats for v in out.values())
    for v in out.values():  # timed again exactly when its first 3 rounds did not decide it
        assert rounds.decided(t(*v.samples[:3])) == (v.repeats == 3)
