"""The generator's state: every value's shape and kind, and the node helpers motifs build with.

A :class:`Builder` records the nodes a spec is made of and, for each value, its shape and kind,
so that every motif draws only what its precondition allows (docs/verification.md §2). The tables below are
the choices motifs draw from, simplest first (hypothesis shrinks toward the first).
"""
from __future__ import annotations

import math

from mlsys_jax.fuzz.motifs_int import INT_BINARY, INT_STANDIN, INT_UNARY

UNARY = ("neg", "sin", "tanh", "abs", "square", "cos", "logistic", "exp_tanh", "log1p_sq",
         "relu", "where_relu", "stop_gradient")
BINARY = ("add", "mul", "sub", "max", "div")
PADDINGS = ("SAME", "VALID", [[0, 1], [1, 0]])
BN_FORMS = ("rsqrt", "div", "named", "affine")
# after an integer conv: exact affine maps (foldable) and truncating division, remainder, shifts
IBN_FORMS = ("affine", "scalar_div", "affine", "div", "rem", "mul_div", "shift", "floordiv")
# near-miss parallel convs: the attribute that differs (merge must refuse) — "none" merges
CONV_PAIRS = ("none", "none_indep", "ksize", "none", "ksize", "stride", "padding", "dilation",
              "groups", "precision")
# the one param in which a near-miss conv pair differs ("none*": mergeable pairs)
NEAR_MISSES = {"ksize": {"k": 1}, "stride": {"stride": 2}, "padding": {"pad": "VALID"},
               "dilation": {"dil": 2}, "groups": {"groups": 2},
               "precision": {"precision": "highest"}}


def conv_out(n: int, k: int, stride: int, pad, dil: int) -> int:
    """Output length of one spatial dim (lax.conv_general_dilated's rule)."""
    eff = (k - 1) * dil + 1
    if pad == "SAME":
        return math.ceil(n / stride)
    if pad == "VALID":
        return math.ceil((n - eff + 1) / stride) if n >= eff else 0
    return (n + pad[0][0] + pad[0][1] - eff) // stride + 1 if n + sum(pad[0]) >= eff else 0


class Builder:
    """Generator state: nodes emitted so far, and the shape and kind of every value.

    A value's kind is its dtype: the program's arithmetic one (``main``: 'f32', 'i32', ...; a
    boolean program computes in 'i32') or 'bool' (masks: comparisons, boolean inputs). Motifs
    pick ``main`` values unless they ask for masks."""

    # the generator's vocabulary, for motifs written beside their rules (passes/rules/)
    CONV_PAIRS, NEAR_MISSES = CONV_PAIRS, NEAR_MISSES

    def __init__(self, chooser, layout: str, input_shapes, *, in_body: str | None = None,
                 dtype: str = "f32", keys: int = 0):
        self.c, self.layout, self.in_body, self.keys = chooser, layout, in_body, keys
        self.main = "i32" if dtype == "bool" else dtype
        self.shapes = [list(s) for s in input_shapes]
        self.kinds = [dtype] * len(self.shapes)
        self.nodes: list = []
        self.used: set = set()
        self.forced: list = []

    @property
    def integer(self) -> bool:
        return self.main == "i32"

    def number(self, floats, ints):
        """A constant: drawn from ``ints`` in integer programs, else from ``floats``."""
        return self.c.choice(ints if self.integer else floats)

    # -- values --------------------------------------------------------------------------
    def add(self, node: dict, shape=None, kind: str | None = None) -> int:
        for a in node["args"]:
            self.used.add(a)
        self.nodes.append(node)
        self.shapes.append(list(shape if shape is not None else self.shapes[node["args"][0]]))
        self.kinds.append(kind or self.main)
        return len(self.shapes) - 1

    def pick(self, pred=None, kind: str | None = None) -> int:
        """A value of ``kind`` (default: the program's arithmetic kind), recent ones likelier;
        ``pred(shape)`` filters."""
        kind = kind or self.main
        ids = [i for i, s in enumerate(self.shapes)
               if self.kinds[i] == kind and (pred is None or pred(s))]
        if not ids:
            return -1
        recent = ids[-3:]
        return self.c.choice(recent) if self.c.chance(0.7) else self.c.choice(ids)

    def main_rank(self) -> int:
        return 2 if self.layout == "dense" else 4

    def pick_main(self) -> int:
        """A value of the program's input shape: convs and wrappers take only these, which keeps
        the set of (primitive, shape, params) small — each is compiled once per campaign."""
        return self.pick(lambda s: s == self.shapes[0])

    def chan_axis(self) -> int:
        return 1 if self.layout == "nchw" else 3

    def choose_outputs(self, dead_p: float) -> list:
        """The last value, forced ones, and (unless leaving dead code) every unused value."""
        last = len(self.shapes) - 1
        outs = [last] + [v for v in self.forced if v != last]
        n_in = len(self.shapes) - len(self.nodes)
        leave_dead = self.c.chance(dead_p)
        for v in range(n_in, last):
            if v not in self.used and v not in outs and not (leave_dead and self.c.chance(0.7)):
                outs.append(v)
        return outs

    # -- node helpers ----------------------------------------------------------------------
    def unary(self, a: int, fn=None) -> int:
        fn = fn or self.c.choice(INT_UNARY if self.integer else UNARY)
        if self.integer:
            fn = INT_STANDIN.get(fn, fn)
        return self.add({"op": "unary", "fn": fn, "args": [a]})

    def combine(self, a: int, b: int) -> int:
        return self.add({"op": "binary", "fn": self.c.choice(INT_BINARY if self.integer
                                                             else BINARY), "args": [a, b]})

    def conv(self, a: int, *, out=None, k=None, stride=None, pad=None, dil=None, groups=None,
             precision="draw", seed=None, wdtype=None, wscale=None) -> int:
        """A conv on image ``a`` (params drawn unless given); -1 if the precondition fails."""
        c, shape = self.c, self.shapes[a]
        cin = shape[self.chan_axis()]
        out = out if out is not None else c.choice((cin, 2 * cin))
        k = k if k is not None else c.choice((1, 3))
        stride = stride if stride is not None else c.choice((1, 1, 2))
        pad = pad if pad is not None else c.choice(PADDINGS)
        dil = dil if dil is not None else c.choice((1, 1, 2))
        groups = groups if groups is not None else c.choice((1, 1, 2))
        precision = c.choice((None, None, "highest")) if precision == "draw" else precision
        if cin % groups or out % groups:
            groups = 1
        sp = (2, 3) if self.layout == "nchw" else (1, 2)  # spatial axes
        dims = [conv_out(shape[d], k, stride, pad, dil) for d in sp]
        if min(dims) < 1:
            return -1
        new = list(shape)
        new[sp[0]], new[sp[1]], new[self.chan_axis()] = dims[0], dims[1], out
        node = {"op": "conv", "out": out, "k": k, "stride": stride, "pad": pad, "dil": dil,
                "groups": groups, "precision": precision,
                "seed": seed if seed is not None else c.seed(), "args": [a]}
        if wdtype is not None:  # 16-bit weights with float32 accumulation (fuzz/user_ops.py)
            node.update(wdtype=wdtype, wscale=wscale or 1.0)
        return self.add(node, new)

    def bn(self, a: int, form=None, gscale: float | None = None) -> int:
        c = self.c
        if self.integer:  # integer "normalisation": exact affine maps, and division (no fold)
            return self.add({"op": "ibn", "form": form or c.choice(IBN_FORMS), "seed": c.seed(),
                             "args": [a]})
        form = form or c.choice(BN_FORMS if self.layout == "nchw" else
                                tuple(f for f in BN_FORMS if f != "named"))
        node = {"op": "bn", "form": form, "eps": c.choice((1e-5, 1e-3, 0.1, 1e-8)),
                "var": c.choice(("normal", "tiny")), "neg_gamma": c.chance(0.5),
                "seed": c.seed(), "args": [a]}
        if gscale is not None:  # a scale near the weights' dtype's range
            node["gscale"] = gscale
        return self.add(node)
