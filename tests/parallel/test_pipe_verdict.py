"""The pipeline's verdict (``parallel/pipe/verdict.judge_step``) on constructed one-device
references: float32 values whose equivalent computations differ by rounding, a float64 twin that
says what the mathematics does, and a pipeline result that is right or off."""
import numpy as np
import pytest

from mlsys_jax.parallel.pipe.verdict import PipelineVerdict, judge_step

RNG = np.random.default_rng(0)
G = {"w": RNG.standard_normal((8, 8)).astype(np.float32),
     "b": RNG.standard_normal(8).astype(np.float32)}
P = {k: RNG.standard_normal(v.shape).astype(np.float32) for k, v in G.items()}
EPS = float(np.finfo(np.float32).eps)


def nudged(tree, ulps, seed):
    """``tree`` with each element moved by up to ``ulps`` float32 ulps of the tree's scale: a
    computation that differs from it by rounding alone."""
    r = np.random.default_rng(seed)
    scale = max(float(np.abs(v).max()) for v in tree.values())
    return {k: (v + ulps * EPS * scale * r.uniform(-1, 1, v.shape)).astype(np.float32)
            for k, v in tree.items()}


def update(g):
    return {k: P[k] - np.float32(0.1) * g[k] for k in P}


def refs_of(a, b, c, twin_gap=0.0):
    out = {k: (np.float32(2.5) + np.float32(i * EPS), g, update(g), None)
           for i, (k, g) in enumerate(zip("ABC", (a, b, c)))}
    out["terms"] = (np.float32(2.5), {k: np.float32(np.abs(v).max()) for k, v in a.items()})
    exact = {k: v.astype(np.float64) for k, v in G.items()}
    out["A64"] = {"loss": 2.5, "grads": {k: v + twin_gap for k, v in exact.items()}}
    out["B64"] = {"loss": 2.5, "grads": exact}
    return out


def judged(refs, grads):
    v = PipelineVerdict()
    separable = judge_step(v, refs, {"loss": refs["A"][0], "grads": grads,
                                     "params": update(grads)}, update)
    return separable, v


@pytest.fixture
def refs():
    # A (the whole batch) rounds 40 ulps away from B (the microbatch mean); B and C (the same
    # microbatches summed in another order) 2 ulps apart
    return refs_of(nudged(G, 40, 1), G, nudged(G, 2, 2))


def test_the_float64_twin_decides_separability_not_float32_rounding(refs):
    separable, v = judged(refs, nudged(refs["A"][1], 20, 3))
    assert separable and v.within("grads") and v.within("params")
    assert v.worst["separability"]["diff"] == 0.0  # float64's A - B


def test_a_loss_the_twin_finds_mixed_is_not_separable():
    refs = refs_of(nudged(G, 40, 1), G, nudged(G, 2, 2), twin_gap=1e-3)
    separable, v = judged(refs, refs["B"][1])
    assert not separable and v.within("grads")  # the pipeline computes B, exactly


@pytest.mark.parametrize("relative", [1e-3, 1e-4])
def test_a_pipeline_off_in_one_leaf_is_caught(refs, relative):
    grads = dict(refs["A"][1])
    grads["b"] = grads["b"] * np.float32(1 + relative)
    _, v = judged(refs, grads)
    assert not v.within("grads")
