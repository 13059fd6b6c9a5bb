"""Fuzz reproducer (10k campaign, seed 0, program 5219): a false alarm of the first oracle, kept.

x -> conv 3x3/2 -> BN (tiny variance, eps 1e-3, negative gamma) -> unknown primitive sin(y)+y.
fold_conv_bn is right (outputs pass), but the VJP's max-abs error ratio was 3.23 (RMS 2.16) against
the float64 program: the primal's allowed rounding difference in y (|y| up to ~100) is amplified
by the primitive's derivative cos(y)+1. The oracle now judges derivatives on the RMS error with
3x slack (oracles.compare); this case must pass under it.
"""

import pytest

from mlsys_jax.fuzz.reproduce import replay

SPEC = {'dtype': 'f32',
 'inputs': [[2, 4, 6, 6]],
 'layout': 'nchw',
 'nodes': [{'args': [], 'fn': 'sin', 'op': 'const', 'seed': 1977357087, 'shape': [2, 4, 6, 6]},
           {'args': [0],
            'dil': 1,
            'groups': 1,
            'k': 3,
            'op': 'conv',
            'out': 8,
            'pad': 'SAME',
            'precision': 'highest',
            'seed': 2023668671,
            'stride': 2},
           {'args': [2],
            'eps': 0.001,
            'form': 'rsqrt',
            'neg_gamma': True,
            'op': 'bn',
            'seed': 1753990213,
            'var': 'tiny'},
           {'args': [3], 'op': 'opaque'}],
 'outputs': [4]}
PASS = 'fold_conv_bn'
SEED = 4260364546

@pytest.mark.slow
def test_reproducer():
    assert replay(SPEC, PASS, SEED) == []
