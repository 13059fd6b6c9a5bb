"""10k-campaign reproducer (seed 0, program 4813): merge_parallel_convs on an input with ±Inf
(output 0: 8 finite value(s) where the original is NaN/Inf).

conv(x, W1) + conv(x, W2) -> conv(x, W1 + W2) is §4.1 rule 2, exact for finite inputs only:
at an Inf input, Inf·w1 + Inf·w2 is NaN where w1 and w2 differ in sign, Inf·(w1 + w2) is ±Inf.
The pass says so (its docstring and log line); the fuzzer judges it on the program's finite
inputs (its registry caveat, read by fuzz/judge.py), as enlarge_conv_kernel's 0·Inf.
"""
from mlsys_jax.fuzz.reproduce import replay

SPEC = {'dtype': 'f32',
 'inputs': [[2, 4, 6, 6]],
 'keys': 0,
 'layout': 'nchw',
 'nodes': [{'args': [0],
            'dil': 1,
            'groups': 1,
            'k': 3,
            'op': 'conv',
            'out': 4,
            'pad': 'SAME',
            'precision': None,
            'seed': 2105722611,
            'stride': 1},
           {'args': [0],
            'dil': 1,
            'groups': 1,
            'k': 3,
            'op': 'conv',
            'out': 4,
            'pad': 'SAME',
            'precision': None,
            'seed': 673129286,
            'stride': 1},
           {'args': [1, 2], 'fn': 'add', 'op': 'binary'},
           {'args': [3], 'fn': 'logistic', 'op': 'unary'}],
 'outputs': [4],
 'special': True}
PASS = 'merge_parallel_convs'
SEED = 2580702261

def test_reproducer():
    assert replay(SPEC, PASS, SEED) == []
