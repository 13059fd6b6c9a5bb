"""``--hw here`` measures only the set of kernels a command shows: the other set reads the cache
and derives the rest from the shown set's times (an op alone gets its fused kernel's run time in
proportion to its roofline bound; a fused kernel the sum of its ops'), marked ``derived``. And
``--hw cpu`` says, when its estimate is far below what a quick probe took, that ``--hw here``
predicts this machine."""
import contextlib
import io
import json
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from mlsys_jax import cli, cost, ir
from mlsys_jax.cli.measured import FAR_BELOW, roofline_hint
from mlsys_jax.cost import cache
from mlsys_jax.cost.here import OperatorModel, here_hardware, operators
from mlsys_jax.cost.here.dispatch import DispatchCost

F32 = jnp.float32
DISPATCH = DispatchCost(call_us=5.0, per_input_us=0.3, per_output_us=1.0, per_kernel_us=0.4)


@pytest.fixture(autouse=True, scope="module")
def cache_home(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


def block(x, w):
    return jnp.tanh(x @ w * 2.0 + 1.0).sum(axis=0)


def traced():
    s = jax.ShapeDtypeStruct((64, 64), F32)
    return ir.trace(block, s, s)


def model_at(path, shown) -> OperatorModel:
    model = OperatorModel(path, repeats=2, min_time_s=2e-4, progress=False)
    model.entries["dispatch"] = DISPATCH.to_dict()
    model.shown = shown
    return model


def kernel_keys(model) -> set:
    return {k for k in model.entries if k.startswith("kernel:")}


def test_fused_shown_measures_only_the_fused_kernels_and_derives_the_ops(tmp_path):
    closed, model = traced(), model_at(tmp_path / "ops.json", shown=True)
    hw = here_hardware(model)
    fused = cost.estimate(closed, hw=hw, fused=True)
    keys = kernel_keys(model)
    assert {k.model for k in fused.kernels} == {"measured"}
    unfused = cost.estimate(closed, hw=hw, fused=False)
    assert kernel_keys(model) == keys  # nothing of the unfused set measured
    assert {k.model for k in unfused.kernels} == {"cached", "derived"}  # the matmul is shared
    for big in fused.kernels:
        ops = [k for k in unfused.kernels if set(k.index) <= set(big.index)]
        if all(k.model == "derived" for k in ops):  # the fused loop's run time, split
            assert sum(k.run_us for k in ops) == pytest.approx(big.run_us)
    for k in unfused.kernels:
        if k.model == "derived":
            assert "--unfused measures these" in k.why
            assert k.time_us == pytest.approx(k.run_us + DISPATCH.call(len(k.inputs),
                                                                       len(k.outputs)))


def test_unfused_shown_derives_the_fused_kernels_from_their_ops(tmp_path):
    closed, model = traced(), model_at(tmp_path / "ops.json", shown=False)
    hw = here_hardware(model)
    fused = cost.estimate(closed, hw=hw, fused=True)  # the fused set first, as inspect does
    unfused = cost.estimate(closed, hw=hw, fused=False)
    assert {k.model for k in unfused.kernels} <= {"measured", "cached"}
    programs = {p.key for p in model.programs(closed, cost.kernels(closed, fused=False, hw=hw))}
    assert kernel_keys(model) == {"kernel:" + k for k in programs}  # only the ops alone
    assert {k.model for k in fused.kernels if len(k.index) == 1} == {"cached"}  # the matmul
    (loop,) = [k for k in fused.kernels if len(k.index) > 1]
    assert loop.model == "derived" and "--fused measures these" in loop.why
    ops = [k for k in unfused.kernels if set(k.index) <= set(loop.index)]
    assert loop.run_us == pytest.approx(sum(k.run_us for k in ops))
    assert loop.time_us == pytest.approx(loop.run_us + DISPATCH.per_kernel_us)


def test_without_a_shown_set_both_sets_are_measured(tmp_path):
    closed, model = traced(), model_at(tmp_path / "ops.json", shown=None)
    hw = here_hardware(model)
    for fused in (True, False):
        r = cost.estimate(closed, hw=hw, fused=fused)
        assert {k.model for k in r.kernels} <= {"measured", "cached"}


def report(name: str, time_us: float):
    return SimpleNamespace(hardware=SimpleNamespace(name=name), time_us=time_us)


def test_the_cpu_roofline_points_to_here_when_far_below_a_probe():
    hint = roofline_hint(report("cpu", 100.0), 100.0 * FAR_BELOW * 2)
    assert "--hw here predicts this machine" in hint and f"{2 * FAR_BELOW:.3g}×" in hint
    assert roofline_hint(report("cpu", 100.0), 100.0 * FAR_BELOW * 0.9) == ""
    assert roofline_hint(report("h100", 100.0), 1e6) == ""  # another machine's model
    assert roofline_hint(report("cpu", 100.0), None) == ""  # no probe (--no-xla)


SOURCE = '''
import jax.numpy as jnp

def block(x, w):
    return jnp.tanh(x @ w * 2.0 + 1.0).sum(axis=0)
'''


def run(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(list(argv))
    return rc, out.getvalue()


@pytest.fixture
def target(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(SOURCE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model = model_at(None, shown=None)
    monkeypatch.setitem(operators._MODELS, cache.cache_dir(), model)
    return str(tmp_path / "model.py") + ":block", model


ARGS = ("--arg", "f32[64,64]", "--arg", "f32[64,64]")


def test_inspect_here_measures_the_table_set_and_says_the_other_is_derived(target):
    path, model = target
    rc, out = run("--devices", "8", "inspect", path, *ARGS, "--hw", "here", "--no-xla")
    assert rc == 0, out
    hw = here_hardware(model)
    closed = ir.trace(block, *(jax.ShapeDtypeStruct((64, 64), F32),) * 2)
    fused = {"kernel:" + p.key
             for p in model.programs(closed, cost.kernels(closed, fused=True, hw=hw))}
    assert kernel_keys(model) == fused  # the table's (fused) kernels, nothing else
    assert "derived from the table's" in " ".join(out.split())


def test_inspect_cpu_probes_the_compiled_function(target):
    path, _ = target
    rc, out = run("--devices", "8", "inspect", path, *ARGS, "--hw", "cpu", "--json")
    assert rc == 0, out
    d = json.loads(out)
    assert d["probe"]["us"] > 0
    assert d["probe"]["predicted_over_probe"] == pytest.approx(d["total"]["fused_time_us"]
                                                               / d["probe"]["us"])


HLO = """HloModule m

%fused_computation (p0: f32[1,7,7,8], p1: f32[3,3,8,8]) -> f32[1,8] {
  %c0 = f32[1,7,7,8]{3,2,1,0} convolution(%p0, %p1), window={size=3x3 pad=1_1x1_1}
  %c1 = f32[1,7,7,8]{3,2,1,0} convolution(%c0, %p1), window={size=3x3 pad=1_1x1_1}
  ROOT %r = f32[1,8]{1,0} reduce(%c1, %z), dimensions={1,2}, to_apply=%add
}

%fused_computation.1 (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  ROOT %d = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: f32[1,7,7,8], b: f32[3,3,8,8], x: f32[8,8]) -> (f32[1,8], f32[8,8]) {
  %ynn_fusion = f32[1,8]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_computation
  %ynn_fusion.1 = f32[8,8]{1,0} fusion(%x, %x), kind=kCustom, calls=%fused_computation.1
  ROOT %t = (f32[1,8], f32[8,8]) tuple(%ynn_fusion, %ynn_fusion.1)
}
"""


def test_xla_kernels_running_several_contractions_are_found_and_said():
    from mlsys_jax.cli.measured import fused_contractions_line
    from mlsys_jax.cost.xla import fused_contractions

    counts = fused_contractions(SimpleNamespace(as_text=lambda: HLO))
    assert counts == [2]  # the two chained convolutions; the lone dot is its own kernel
    line = fused_contractions_line(counts)
    assert "2 contractions into 1 kernel(s)" in line and "--measure" in line
    lone = jax.jit(lambda a, b: jnp.tanh(a @ b)).lower(jnp.ones((8, 8)), jnp.ones((8, 8)))
    assert fused_contractions(lone.compile()) == []
