"""10k-campaign reproducer (seed 0, program 1566): a false alarm of the float32 error ratio
(output 0: error ratio 2.16 vs float64 reference (allowed 2)),
settled by the float64 twin (oracles.compare).

conv 3x3/2 -> per-channel affine with variance ~1e-6 and eps 1e-8 (scale ~1e3) -> relu: the fold is
exact in float64; the float32 max-abs error ratio was 2.16 (allowed 2), a tail of amplified
rounding.
"""
from mlsys_jax.fuzz.reproduce import replay

SPEC = {'dtype': 'f32',
 'inputs': [[2, 4, 6, 6]],
 'layout': 'nchw',
 'nodes': [{'args': [0],
            'dil': 1,
            'groups': 1,
            'k': 3,
            'op': 'conv',
            'out': 4,
            'pad': 'SAME',
            'precision': None,
            'seed': 503469445,
            'stride': 2},
           {'args': [1],
            'eps': 1e-08,
            'form': 'affine',
            'neg_gamma': False,
            'op': 'bn',
            'seed': 1757701476,
            'var': 'tiny'},
           {'args': [2], 'fn': 'relu', 'op': 'unary'},
           {'args': [], 'c': -2.0, 'fn': 'cos', 'op': 'wconst'}],
 'outputs': [3]}
PASS = 'fold_conv_bn'
SEED = 3463419734

def test_reproducer():
    assert replay(SPEC, PASS, SEED) == []
