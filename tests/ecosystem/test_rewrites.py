"""The §4.1–§4.2 rewrites on framework code: every inference BatchNorm of a flax linen, flax nnx and
(vmapped) equinox model folds into its conv; training-mode BatchNorm however written is refused
naming the batch statistics; a conv bias merge is reported as one; ResNet downsample pairs merge
once the strided 1×1 is enlarged at the right tap; the search never loses to the pipeline.

These inspect-only example factories are built once here (their builds are most of this file's
work), and their forward passes are also checked to run jitted in float32 as their libraries
intend; tests/ecosystem/test_examples.py checks the other example factories. As there, each is
built under ``init_bits`` (tests/ecosystem/init_bits.py): nothing here depends on the drawn
values, and the graphs judged hold no random draw."""
import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import equinox_cnn
import flax_resnet
import nnx_resnet
import stax_cnn
from mlsys_jax import ir, passes as P
from mlsys_jax.ir.evaluate import eval_open
from mlsys_jax.passes.search import search
from tests.ecosystem.init_bits import init_bits


def inference_graph(f, args):
    """An example factory's ``(f, args)`` as an inference graph: the input ``args[1]`` traced,
    everything else (parameters, BatchNorm state, static leaves) closed over as constants."""
    x = args[1]
    return ir.trace(lambda x: f(args[0], x, *args[2:]), x), x


def max_diff(a, b, x) -> float:
    # the difference taken in the same program: no eager op compiled per output shape
    return float(jax.jit(lambda x: jnp.max(jnp.abs(ir.interpret(a, x)[0]
                                                   - ir.interpret(b, x)[0])))(x))


def folds(result) -> list[str]:
    return [r.detail for r in result.rewrites if r.rule == "fold_conv_bn"]


INSPECT_ONLY = [flax_resnet, nnx_resnet, equinox_cnn, stax_cnn]


@pytest.fixture(scope="module")
def built():
    """``built(module)``: the example factory's ``(f, args)``, each built once for the file (an
    init compiles many programs: flax's jitted one, nnx's, equinox's and stax's eager ops)."""
    cache = {}

    def get(module):
        if module not in cache:
            with init_bits():
                cache[module] = module.inspect()
        return cache[module]
    return get


@pytest.fixture(scope="module")
def resnet_factory(built):
    return built(flax_resnet)


@pytest.fixture(scope="module")
def resnet(resnet_factory):
    closed, x = inference_graph(*resnet_factory)
    return closed, x, P.run(P.pipeline(), closed)


@pytest.mark.parametrize("module", INSPECT_ONLY, ids=lambda m: m.__name__)
def test_inspect_only_factories_run_jitted_in_float32(built, module):
    f, args = built(module)
    out = eqx.filter_jit(f)(*args)  # equinox modules hold static (non-array) leaves
    assert out.dtype == jnp.float32 and bool(jnp.isfinite(out).all())


def test_flax_resnet_folds_all_20_pairs_within_1e_5(resnet):
    closed, x, res = resnet
    assert len(folds(res)) == 20 and all(d.startswith("folded BatchNorm") for d in folds(res))
    assert ir.primitive_counts(res.jaxpr)["rsqrt"] == 0  # no BatchNorm left
    assert max_diff(closed, res.jaxpr, x) <= 1e-5
    # the three downsample pairs are reported, not silently left apart
    windows = [r.reason for r in res.refusals if "3×3 vs 1×1" in r.reason]
    assert len(windows) == 3


def test_flax_resnet_downsample_pairs_merge_once_enlarged(resnet):
    closed, x, res = resnet
    more = P.run(P.chain(P.enlarge_conv_kernel(), P.merge_parallel_convs(), P.dce()), res.jaxpr)
    enlarged = [r.detail for r in more.rewrites if r.rule == "enlarge_conv_kernel"]
    # 3×3 stride 2, SAME = ((0, 1), (0, 1)) beside a 1×1 stride 2: the 1×1 goes at tap (0, 0)
    assert len(enlarged) == 3 and all("tap (0, 0)" in d and "0·Inf" in d for d in enlarged)
    assert sum("concatenating" in r.detail for r in more.rewrites) == 3
    assert ir.primitive_counts(more.jaxpr)["conv_general_dilated"] == 17
    assert max_diff(closed, more.jaxpr, x) <= 1e-5


def test_flax_resnet_float64_folds_within_1e_12(resnet_factory):
    _, (variables, x) = resnet_factory
    with jax.enable_x64(True):
        # flax_resnet.inspect_f64's network on the same draws: float64 parameters and input,
        # batch_stats in float32 as flax keeps them (one init instead of two)
        params = jax.tree_util.tree_map(lambda a: a.astype(jnp.float64), variables["params"])
        model64 = flax_resnet.ResNet18(dtype=jnp.float64)
        closed, x = inference_graph(model64.apply, ({**variables, "params": params},
                                                    x.astype(jnp.float64)))
        res = P.run(P.pipeline(), closed)
        assert len(folds(res)) == 20
        # Op by op: with float32 batch_stats, XLA's fused float32 rsqrt under jit differs from
        # the single-op one by an ulp (1.6e-7 in the original graph itself).
        a, b = (eval_open(c.jaxpr, c.consts, [x])[0] for c in (closed, res.jaxpr))
        assert a.dtype == jnp.float64 and float(jnp.max(jnp.abs(a - b))) <= 1e-12


def test_search_never_loses_to_the_pipeline(resnet):
    closed, x, res = resnet
    piped = P.cost_summary(res.jaxpr, "h100", None)
    found = search(closed, hw="h100", dtype=None)
    assert found.path[0].rule == "pipeline"
    assert found.best_cost["time_us"] <= piped["time_us"]
    assert found.best_cost["kernels"] <= piped["kernels"]
    assert sum(r.rule == "fold_conv_bn" for r in found.rewrites) == 20


@pytest.mark.parametrize("module,pairs", [(nnx_resnet, 20), (equinox_cnn, 3)],
                         ids=["nnx_resnet", "equinox_cnn"])
def test_nnx_and_vmapped_equinox_pairs_fold(built, module, pairs):
    closed, x = inference_graph(*built(module))
    res = P.run(P.pipeline(), closed)
    assert len(folds(res)) == pairs and not [r for r in res.refusals if r.rule == "fold_conv_bn"]
    assert all(d.startswith("folded BatchNorm") for d in folds(res))
    if module is equinox_cnn:  # seen through the vmapped Conv2d's reshape + squeeze
        before, after = (ir.primitive_counts(c, recursive=False) for c in (closed, res.jaxpr))
        assert before["squeeze"] == after["squeeze"] == 3  # replayed after the new conv
        assert before["sub"] == 3 and after["sub"] == 0  # BatchNorm's (z - mean) is gone
        assert before["div"] - after["div"] == 3         # and its / sqrt(var + eps)
    assert max_diff(closed, res.jaxpr, x) <= 1e-5


def test_stax_bias_merges_and_batch_statistics_are_refused(built):
    closed, x = inference_graph(*built(stax_cnn))
    res = P.run(P.pipeline(), closed)
    assert [d.split(" into")[0] for d in folds(res)] == ["merged a bias add (1 op)"] * 2
    reasons = [r.reason for r in res.refusals if r.rule == "fold_conv_bn"]
    assert len(reasons) == 2 and all("'standardize'" in r and "computed from the batch" in r
                                     for r in reasons)
    assert ir.primitive_counts(res.jaxpr)["reduce_sum"] == ir.primitive_counts(closed)["reduce_sum"]
    assert max_diff(closed, res.jaxpr, x) <= 1e-5


class ConvBN(nn.Module):
    @nn.compact
    def __call__(self, x, train):
        return nn.BatchNorm(use_running_average=not train)(nn.Conv(8, (3, 3))(x))


def test_flax_training_mode_is_refused_and_inference_mode_folds():
    model, x = ConvBN(), jnp.ones((2, 8, 8, 3), jnp.float32)
    with init_bits():   # as the factories above: the values do not matter
        variables = jax.jit(model.init, static_argnames="train")(jax.random.key(0), x,
                                                                  train=False)

    def train(x):
        return model.apply(variables, x, train=True, mutable=["batch_stats"])[0]
    res = P.run(P.pipeline(), ir.trace(train, x))
    assert [d.split(" into")[0] for d in folds(res)] == ["merged a bias add (1 op)"]
    assert "computed from the batch" in res.refusals[0].reason
    res = P.run(P.pipeline(), ir.trace(lambda x: model.apply(variables, x, train=False), x))
    assert folds(res)[0].startswith("folded BatchNorm") and not res.refusals


def test_standardize_written_inline_or_called_is_refused():
    w = jnp.asarray(np.random.default_rng(0).standard_normal((3, 3, 3, 4)), jnp.float32)

    def f(x, inline):
        z = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if inline:
            m = z.mean((0, 1, 2))
            return (z - m) / jnp.sqrt(((z - m) ** 2).mean((0, 1, 2)) + 1e-5)
        return jax.nn.standardize(z, axis=(0, 1, 2))
    for inline in (True, False):
        res = P.run(P.fold_conv_bn(), ir.trace(lambda x: f(x, inline), "f32[2,6,6,3]"))  # noqa: B023 (called in this iteration)
        assert not res.changed and "computed from the batch" in res.refusals[0].reason
