"""mlsys_jax.cost: the lecture's figures, derived here from the formula with the shapes."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import cost, ir, models
from mlsys_jax.errors import MlsysError

PEAK, BW, LAUNCH = 989.4e12, 3.35e12, 4e-6  # H100 BF16, the lecture's model
BF16 = 2


def roofline_us(kernels):
    """Σ max(flops/peak, bytes/bw) + launch over (flops, bytes) pairs, in µs."""
    return sum(max(f / PEAK, b / BW) + LAUNCH for f, b in kernels) * 1e6


def block_figures(n, c, h, w):
    """Hand-derived (kernels, flops) of the §4.2 block's four stages at NCHW = (n, c, h, w)."""
    act = n * c * h * w
    conv = lambda k: (2 * act * c * k * k, (2 * act + c * c * k * k) * BF16)  # noqa: E731
    conv_b = lambda k: (conv(k)[0] + act, conv(k)[1] + c * BF16)  # noqa: E731  (+ bias add)
    bn = (2 * act + 6 * c, (2 * act + 4 * c) * BF16)  # scale & shift; 64-wide vector work
    add, relu = (act, 3 * act * BF16), (act, 2 * act * BF16)
    return {"original": [conv(3), bn, conv(1), bn, add, relu],
            "folded": [conv_b(3), conv_b(1), add, relu],
            "enlarged": [conv_b(3), conv_b(3), add, relu],
            "merged": [conv_b(3), relu]}


def block_graphs(n, c, h, w):
    p = models.resnet_block_init(jax.random.key(0), c)
    folded = models.fold_block_params(p)
    enlarged = models.enlarge_block_params(folded)
    x = jax.ShapeDtypeStruct((n, c, h, w), jnp.float32)
    return {"original": ir.trace(models.resnet_block, p, x),
            "folded": ir.trace(models.resnet_block_folded, folded, x),
            "enlarged": ir.trace(models.resnet_block_folded, enlarged, x),
            "merged": ir.trace(models.resnet_block_merged, models.merge_block_params(enlarged), x)}


LECTURE_BLOCK = {"original": (6, 73.9, 8.23), "folded": (4, 50.5, None),
                 "enlarged": (4, 50.6, 14.81), "merged": (2, 23.4, 7.41)}


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(32, 64, 56, 56), (8, 32, 28, 28)])
def test_block_costs_follow_the_formula(shape):
    graphs, want = block_graphs(*shape), block_figures(*shape)
    for stage, closed in graphs.items():
        r = cost.estimate(closed, "h100", "bf16")
        assert len(r.kernels) == len(want[stage]), stage
        assert r.time_us == pytest.approx(roofline_us(want[stage]), rel=1e-3), stage
        # the vector work inside batch_norm is a handful of FLOPs per channel, not per element
        assert r.total_flops == pytest.approx(sum(f for f, _ in want[stage]), rel=1e-4), stage


@pytest.mark.slow
def test_block_costs_match_the_lecture():
    for stage, closed in block_graphs(32, 64, 56, 56).items():
        kernels, us, gflop = LECTURE_BLOCK[stage]
        r = cost.estimate(closed, "h100", "bf16")
        assert len(r.kernels) == kernels
        assert abs(r.time_us - us) <= 0.1, (stage, r.time_us)
        if gflop is not None:
            assert abs(r.total_flops / 1e9 - gflop) / gflop <= 0.005, (stage, r.total_flops)
    final = cost.estimate(block_graphs(32, 64, 56, 56)["merged"], "h100", "bf16").time_us
    original = cost.estimate(block_graphs(32, 64, 56, 56)["original"], "h100", "bf16").time_us
    assert round(original / final, 2) == pytest.approx(3.16, abs=0.01)


def classifier(batch):
    p = models.mlp_init(jax.random.key(0))
    x, y = models.mnist_batch(jax.random.key(1), batch)
    return ir.trace(models.mlp_loss, p, x, y)


def classifier_figures(b, fused):
    """Hand-derived kernels of the 784→100→10 classifier at batch b, BF16."""
    mm1 = (2 * b * 784 * 100, (b * 784 + 784 * 100 + b * 100) * BF16)
    add1 = (b * 100, (2 * b * 100 + 100) * BF16)
    relu = (b * 100, 2 * b * 100 * BF16)
    mm2 = (2 * b * 100 * 10, (b * 100 + 100 * 10 + b * 10) * BF16)
    add2 = (b * 10, (2 * b * 10 + 10) * BF16)
    xent = (0, (2 * b * 10 + 1) * BF16)  # logits + one-hot labels in, a scalar out
    if not fused:
        return [mm1, add1, relu, mm2, add2, xent]
    return [mm1, (0, (2 * b * 100 + 100) * BF16), mm2, (0, (2 * b * 10 + 10 + 1) * BF16)]


@pytest.mark.slow
@pytest.mark.parametrize("batch", [8192, 1000])
def test_classifier_fusion_follows_the_formula(batch):
    closed = classifier(batch)
    for fused in (False, True):
        r = cost.estimate(closed, "h100", "bf16", fused=fused)
        want = classifier_figures(batch, fused)
        assert len(r.kernels) == len(want)
        assert r.time_us == pytest.approx(roofline_us(want), rel=2e-3)


@pytest.mark.slow
def test_classifier_matches_the_lecture_at_batch_8192():
    closed = classifier(8192)
    unfused = cost.estimate(closed, "h100", "bf16")
    fused = cost.estimate(closed, "h100", "bf16", fused=True)
    assert [k.name for k in unfused.kernels] == ["matmul", "add", "relu", "matmul", "add", "softmax_xent"]
    assert [k.name for k in fused.kernels] == ["matmul", "add+relu", "matmul", "add+softmax_xent"]
    assert abs(unfused.time_us - 31.1) <= 0.1 and abs(fused.time_us - 22.0) <= 0.1


@pytest.mark.slow
def test_every_primitive_of_the_models_and_their_gradients_has_a_rule():
    p = models.mlp_init(jax.random.key(0))
    x, y = models.mnist_batch(jax.random.key(1), 8)
    bp = models.resnet_block_init(jax.random.key(0), 4)
    xb = jnp.ones((2, 4, 6, 6), jnp.float32)
    graphs = [ir.trace(models.mlp_loss, p, x, y), ir.trace(jax.grad(models.mlp_loss), p, x, y)]
    for stage in block_graphs(2, 4, 6, 6).values():
        graphs.append(stage)
    block_loss = lambda q, v: models.resnet_block(q, v).sum()  # noqa: E731
    graphs += [ir.trace(jax.grad(block_loss, argnums=(0, 1)), bp, xb)]
    merged = models.merge_block_params(models.enlarge_block_params(models.fold_block_params(bp)))
    graphs += [ir.trace(jax.grad(lambda q, v: models.resnet_block_merged(q, v).sum(), argnums=(0, 1)),
                        merged, xb)]
    seen = set()
    for g in graphs:
        seen |= set(ir.primitive_counts(g))
        assert cost.estimate(g, strict=True).unknown == []
    assert {"dot_general", "conv_general_dilated", "transpose", "select_n", "rev"} & seen
    assert all(cost.known(p) for p in seen)


@pytest.mark.parametrize("kw", [
    dict(window_strides=(2, 2), padding="SAME"),
    dict(window_strides=(1, 1), padding=[(2, 2), (2, 2)], rhs_dilation=(2, 2)),
    dict(window_strides=(1, 1), padding="VALID", feature_group_count=4),
])
def test_conv_rule_counts_every_form_including_its_gradient(kw):
    x = jnp.ones((2, 8, 9, 9), jnp.float32)
    w = jnp.ones((8, 8 // kw.get("feature_group_count", 1), 3, 3), jnp.float32)
    f = lambda x, w: lax.conv_general_dilated(x, w, dimension_numbers=("NCHW", "OIHW", "NCHW"), **kw)  # noqa: E731
    closed = ir.trace(f, x, w)
    out = closed.jaxpr.outvars[0].aval.shape
    assert cost.eqn_flops(closed.jaxpr.eqns[0])[0] == 2 * math.prod(out) * math.prod(w.shape[1:])
    grads = ir.trace(jax.grad(lambda x, w: f(x, w).sum(), argnums=(0, 1)), x, w)
    convs = [e for _, e in ir.walk(grads) if e.primitive.name == "conv_general_dilated"]
    assert len(convs) == 3  # forward, input gradient, weight gradient
    for e in convs:  # every form costs 2 × (output elements) × (kernel elements per output)
        flops = cost.eqn_flops(e)[0]
        assert flops > 0 and flops % (2 * math.prod(e.outvars[0].aval.shape)) == 0


def test_unknown_primitives_are_listed_and_strict_raises():
    from jax.extend.core import Primitive

    mystery = Primitive("mystery_op")
    mystery.def_abstract_eval(lambda x: x)
    closed = ir.trace(lambda x: mystery.bind(x) * 2, "f32[4]")
    r = cost.estimate(closed)
    assert r.unknown == ["mystery_op"]
    with pytest.raises(MlsysError, match="mystery_op"):
        cost.estimate(closed, strict=True)


def test_constants_count_as_bytes_read():
    w = np.ones((100, 10), np.float32)
    r = cost.estimate(ir.trace(lambda x: x @ w, "f32[8,100]"))
    assert r.kernels[0].bytes == (8 * 100 + 100 * 10 + 8 * 10) * 4


def test_liveness_by_hand():
    # x:4 KiB -> a = x*2 (x dies) -> b = a+1, c = a*3 (a dies) -> out b+c
    closed = ir.trace(lambda x: (lambda a: (a + 1) + (a * 3))(x * 2), "f32[1024]")
    live = cost.liveness(closed)
    kib = 4096
    assert live.timeline == (2 * kib, 2 * kib, 3 * kib, 3 * kib)
    assert live.peak_bytes == 3 * kib
    assert cost.liveness(closed, dtype="bf16").peak_bytes == 3 * kib // 2


@pytest.mark.slow
def test_hardware_names_and_cpu_calibration(tmp_path, monkeypatch):
    assert cost.get_hardware("H100").bandwidth == 3.35e12
    with pytest.raises(MlsysError, match="unknown hardware"):
        cost.get_hardware("tpu9")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu = cost.get_hardware("cpu")
    assert cpu.peak("f32") > 1e8 and cpu.bandwidth > 1e8 and 0 < cpu.launch_s < 1e-2
    assert cost.get_hardware("cpu") == cpu  # cached
