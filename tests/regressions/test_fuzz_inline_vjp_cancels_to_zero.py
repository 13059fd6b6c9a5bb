"""10k-campaign reproducer (seed 0, program 2871): a false alarm of the float32 error ratio
(vjp 0: error ratio 1.98e+12 vs float64 reference (allowed 3)), settled by the float64 twin's
precision scaling (fuzz/twin.py, twin_equal).

jit(f)(y) - jit(f)(y) with f = y**2 * y**3 after a BN with variance ~1e-8: the original's VJP is
exactly 0 (two call transposes cancel); inlined, add_any reorders terms of ~1e16 and leaves one
rounding of them (1e7 RMS in float32). Its float64 twin is not within 1e-9 of 0 either, but its
error is ~2⁻²⁹ of float32's, as rounding's is; a wrong rewrite's would not shrink.
"""
from mlsys_jax.fuzz.reproduce import replay

SPEC = {'dtype': 'f32',
 'inputs': [[2, 4, 6, 6]],
 'keys': 0,
 'layout': 'nchw',
 'nodes': [{'args': [0],
            'eps': 1e-08,
            'form': 'named',
            'neg_gamma': False,
            'op': 'bn',
            'seed': 1594475636,
            'var': 'tiny'},
           {'args': [1],
            'body': [{'args': [0], 'op': 'pow', 'y': 2},
                     {'args': [0], 'op': 'pow', 'y': 3},
                     {'args': [1, 2], 'fn': 'mul', 'op': 'binary'}],
            'name': 'blk12',
            'op': 'jit'},
           {'args': [1],
            'body': [{'args': [0], 'op': 'pow', 'y': 2},
                     {'args': [0], 'op': 'pow', 'y': 3},
                     {'args': [1, 2], 'fn': 'mul', 'op': 'binary'}],
            'name': 'blk12',
            'op': 'jit'},
           {'args': [2, 3], 'fn': 'sub', 'op': 'binary'}],
 'outputs': [4],
 'special': False}
PASS = 'inline'
SEED = 1064454486

def test_reproducer():
    assert replay(SPEC, PASS, SEED) == []
