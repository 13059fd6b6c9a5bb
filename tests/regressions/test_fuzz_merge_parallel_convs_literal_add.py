"""Fuzz reproducer (shrunk by hand from campaign seed 0/1 failures): crash in merge_parallel_convs.

``conv(x, W) + 1.0``: an ``add`` whose operand is a Literal, in a jaxpr level that has a conv site.
``_merge_plans`` calls ``_explain_nonlinear``, which tests ``v in producer`` for every add operand;
Literals are unhashable, so the pass raises ``TypeError: unhashable type: 'Literal'`` instead of
leaving the program alone. Any program with a conv and ``+ python_float`` (or ``a / (1 + b*b)``)
at the same level hit it (about 1 program in 4 of a default campaign). Fixed in 25ab9e5; kept as
a regression case.
"""
from mlsys_jax.fuzz.reproduce import replay

SPEC = {"layout": "nchw", "dtype": "f32", "inputs": [[2, 4, 6, 6]],
        "nodes": [{"op": "conv", "out": 4, "k": 1, "stride": 1, "pad": "SAME", "dil": 1,
                   "groups": 1, "precision": None, "seed": 0, "args": [0]},
                  {"op": "scalar", "fn": "add", "c": 1.0, "args": [1]}],
        "outputs": [2]}
PASS = "merge_parallel_convs"
SEED = 0


def test_reproducer():
    assert replay(SPEC, PASS, SEED) == []
