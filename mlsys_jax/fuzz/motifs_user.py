"""Motifs that imitate what users write (docs/verification.md §2; their meaning: ``fuzz/user_ops.py``).

A grammar that only draws the lecture's patterns never draws what users' code has: a jitted helper
``conv(x, w) + b[None, None, :, None]`` whose bias runs along H when H == C, which a shape-only
check takes for a per-channel bias. So image programs are sometimes square (C == H == W: a bias along any axis has
the channels' length), Dense outputs sometimes have as many features as the batch has rows, and
every motif below draws its axes, scales and dtypes from what frameworks and users do.
"""
from __future__ import annotations

from mlsys_jax.passes.rules import fold_dense_bn, fold_matmul_scale

SQUARE = [2, 4, 4, 4]                  # C == H == W, for NCHW and NHWC alike
TYPED = ("div", "mul_int", "where")
# the Dense rules' motifs live beside their rules (passes/rules/); the generator draws them here
m_dense_bn, m_attention = fold_dense_bn.motif, fold_matmul_scale.motif


def m_helper(g):
    """A named jitted conv + bias, the bias along the channels or (equal lengths) another axis,
    often followed by a BatchNorm."""
    v = g.pick_main()
    shape = g.shapes[v]
    ch = g.chan_axis()
    spatial = (2, 3) if ch == 1 else (1, 2)
    axis = g.c.choice((ch, spatial[0], spatial[1], 0))
    y = g.add({"op": "helper", "k": g.c.choice((1, 3)), "out": shape[ch], "axis": axis,
               "seed": g.c.seed(), "name": "conv_block", "args": [v]}, shape)
    if g.c.chance(0.6):
        g.bn(y)


def m_typed(g):
    """A typed literal from ``lax.stop_gradient`` of a Python scalar (equinox's Dropout)."""
    g.add({"op": "typed", "fn": g.c.choice(TYPED), "args": [g.pick_main()]})


def m_low_precision(g):
    """Weights kept in a 16-bit dtype with float32 accumulation; float16 ones of a few hundred
    before a BatchNorm scale of 200 (the folded weights would exceed float16's 65504)."""
    v = g.pick_main()
    wd = g.c.choice(("f16", "bf16"))
    if g.layout == "dense":
        g.add({"op": "dense", "n": g.shapes[v][1], "wdtype": wd, "seed": g.c.seed(),
               "args": [v]})
        return
    big = wd == "f16" and g.c.chance(0.6)
    z = g.conv(v, stride=1, pad="SAME", dil=1, groups=1, wdtype=wd,
               wscale=1800.0 if big else 1.0)
    if z >= 0 and big:
        g.bn(z, gscale=200.0)


def draw(g):
    """One or two user-style motifs fit for the program's layout and dtype."""
    table = [m_typed]
    if g.layout == "dense":
        table += [m_dense_bn, m_dense_bn] + ([] if g.integer else [m_attention, m_attention])
    else:
        table += [m_helper, m_helper]
    if g.main == "f32":
        table.append(m_low_precision)
    for _ in range(g.c.integer(1, 2)):
        g.c.choice(table)(g)
