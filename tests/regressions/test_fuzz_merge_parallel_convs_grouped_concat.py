"""Fuzz reproducer (campaign seed 0, programs 63 and 268; shrunk by hand): wrong results from
merge_parallel_convs on *grouped* convs used independently.

Two convs on one input with ``feature_group_count=2`` and separately used outputs are merged by
concatenating their weights along the output-feature axis and slicing the output. With groups,
output channel ``o`` belongs to group ``o // (O / groups)``: the concatenated kernel [Wa; Wb] puts
all of Wa's channels in group 0 and all of Wb's in group 1, so both slices read the wrong input
channels (error ratio ~5e5 against the float64 reference, NCHW and NHWC alike). Groups = 1 is fine.
Fixed in 25ab9e5 (grouped convs are never concatenated); kept as a regression case.
"""
import pytest

from mlsys_jax.fuzz.reproduce import replay

PASS = "merge_parallel_convs"


def spec(layout, shape):
    conv = lambda seed: {"op": "conv", "out": 4, "k": 1, "stride": 1, "pad": "SAME",  # noqa: E731
                         "dil": 1, "groups": 2, "precision": None, "seed": seed, "args": [0]}
    return {"layout": layout, "dtype": "f32", "inputs": [shape], "nodes": [conv(1), conv(2)],
            "outputs": [1, 2]}


@pytest.mark.parametrize("layout,shape", [("nchw", [2, 4, 6, 6]), ("nhwc", [2, 6, 6, 4])])
def test_reproducer(layout, shape):
    assert replay(spec(layout, shape), PASS, 0) == []


def test_ungrouped_concat_merge_is_right():
    s = spec("nchw", [2, 4, 6, 6])
    for n in s["nodes"]:
        n["groups"] = 1
    assert replay(s, PASS, 0) == []
