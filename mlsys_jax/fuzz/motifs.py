"""Generator motifs: small node patterns that give each pass something to do (TESTING.md §2).

Each motif checks its precondition (a value of the right rank, channels divisible by groups, an
output window of at least one pixel) before it emits nodes, so every spec traces.
"""
from __future__ import annotations

import math

UNARY = ("neg", "sin", "tanh", "abs", "square", "cos", "logistic", "exp_tanh", "log1p_sq",
         "relu", "where_relu", "stop_gradient")
BINARY = ("add", "mul", "sub", "max", "div")
WRAPPERS = ("jit", "checkpoint", "cond", "scan", "while", "custom_jvp", "custom_vjp")
POLICIES = (None, "nothing_saveable", "everything_saveable", "dots_saveable")
PADDINGS = ("SAME", "VALID", [[0, 1], [1, 0]])
BN_FORMS = ("rsqrt", "div", "named", "affine")
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
    """Generator state: nodes emitted so far and the shape of every value."""

    def __init__(self, chooser, layout: str, input_shapes, *, in_body: str | None = None):
        self.c, self.layout, self.in_body = chooser, layout, in_body
        self.shapes = [list(s) for s in input_shapes]
        self.nodes: list = []
        self.used: set = set()
        self.forced: list = []

    # -- values --------------------------------------------------------------------------
    def add(self, node: dict, shape=None) -> int:
        for a in node["args"]:
            self.used.add(a)
        self.nodes.append(node)
        self.shapes.append(list(shape if shape is not None else self.shapes[node["args"][0]]))
        return len(self.shapes) - 1

    def pick(self, pred=None) -> int:
        """A value (recent ones likelier); ``pred(shape)`` filters."""
        ids = [i for i, s in enumerate(self.shapes) if pred is None or pred(s)]
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
        fn = fn or self.c.choice(UNARY)
        return self.add({"op": "unary", "fn": fn, "args": [a]})

    def combine(self, a: int, b: int) -> int:
        return self.add({"op": "binary", "fn": self.c.choice(BINARY), "args": [a, b]})

    def conv(self, a: int, *, out=None, k=None, stride=None, pad=None, dil=None, groups=None,
             precision="draw", seed=None) -> int:
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
        return self.add(node, new)

    def bn(self, a: int, form=None) -> int:
        c = self.c
        form = form or c.choice(BN_FORMS if self.layout == "nchw" else
                                tuple(f for f in BN_FORMS if f != "named"))
        return self.add({"op": "bn", "form": form, "eps": c.choice((1e-5, 1e-3, 0.1, 1e-8)),
                         "var": c.choice(("normal", "tiny")), "neg_gamma": c.chance(0.5),
                         "seed": c.seed(), "args": [a]})


# ---- motifs ------------------------------------------------------------------------------

def m_chain(g: Builder):
    """Elementwise chain whose head has several consumers (fusion and CSE food)."""
    v = g.pick_main()
    head = g.unary(v)
    a = g.unary(head)
    if g.c.chance(0.5):
        a = g.add({"op": "scalar", "fn": g.c.choice(("add", "mul", "sub")),
                   "c": g.c.choice((0.5, 2.0, -1.0, 3.0)), "args": [a]})
    b = g.unary(head)
    g.combine(a, b)


def m_dup(g: Builder):
    """An exact duplicate of an earlier pure node (CSE must merge it)."""
    n_in = len(g.shapes) - len(g.nodes)
    cands = [i for i, n in enumerate(g.nodes) if n["op"] in ("unary", "scalar", "pow", "binary",
                                                              "conv", "matmul", "jit")]
    if not cands:
        return m_chain(g)
    i = g.c.choice(cands)
    g.combine(n_in + i, g.add(dict(g.nodes[i]), g.shapes[n_in + i]))


def m_near_dup(g: Builder):
    """Same input, different params (a param-blind CSE merges them wrongly)."""
    v = g.pick_main()
    kind = g.c.choice(("pow", "reduce", "scalar"))
    if kind == "pow":
        a = g.add({"op": "pow", "y": 2, "args": [v]})
        b = g.add({"op": "pow", "y": 3, "args": [v]})
        g.combine(a, b)
    elif kind == "reduce":
        for ax in (0, 1):
            shape = list(g.shapes[v])
            shape[ax] = 1
            g.forced.append(g.add({"op": "reduce", "axis": ax, "args": [v]}, shape))
    else:
        a = g.add({"op": "scalar", "fn": "mul", "c": 2.0, "args": [v]})
        b = g.add({"op": "scalar", "fn": "mul", "c": 3.0, "args": [v]})
        g.combine(a, b)


def m_const(g: Builder):
    """A constant subgraph (captured array through a few ops) combined with a value, or a weak
    scalar computed from Python floats (folding must keep weak_type)."""
    v = g.pick_main()
    if g.c.chance(0.5):
        k = g.add({"op": "const", "fn": g.c.choice(("sin", "affine", "square")),
                   "shape": g.shapes[v], "seed": g.c.seed(), "args": []}, g.shapes[v])
        g.combine(v, k)
    else:
        s = g.add({"op": "wconst", "fn": g.c.choice(("cos", "exp")),
                   "c": g.c.choice((0.5, 1.5, -2.0)), "args": []}, [])
        if g.c.chance(0.5):
            g.forced.append(s)
        g.combine(v, s)


def m_matmul(g: Builder):
    v = g.pick(lambda s: len(s) == 2)
    g.add({"op": "matmul", "n": g.shapes[v][1], "seed": g.c.seed(), "args": [v]})


def m_conv_bn(g: Builder):
    """conv → BN (→ relu): every layout, eps, tiny variance, negative gamma, strides, padding,
    dilation and groups; sometimes a training-mode BN that must be left alone."""
    z = g.conv(g.pick_main())
    if z < 0:
        return
    y = g.add({"op": "train_bn", "args": [z]}) if g.c.chance(0.1) else g.bn(z)
    if g.c.chance(0.5):
        g.unary(y, "relu")


def m_parallel_convs(g: Builder):
    """Two convs on one input: mergeable (summed or used apart) or a near-miss that differs in
    one attribute (kernel size: enlarge first; others: merge must refuse)."""
    c, v = g.c, g.pick_main()
    cin = g.shapes[v][g.chan_axis()]
    variant = c.choice(CONV_PAIRS)
    base = dict(out=cin, k=3, stride=1, pad="SAME", dil=1, groups=1, precision=None)
    other = {**base, **NEAR_MISSES.get(variant, {})}
    a = g.conv(v, **base)
    b = g.conv(v, **other)
    if g.shapes[a] == g.shapes[b] and variant != "none_indep":
        g.combine(a, b) if c.chance(0.3) else g.add({"op": "binary", "fn": "add", "args": [a, b]})
    else:
        g.forced += [a, b]


def m_misc(g: Builder):
    v = g.pick_main()
    op = g.c.choice(("debug", "opaque", "nan_unsafe"))
    if op == "nan_unsafe":
        g.add({"op": "nan_unsafe", "fn": g.c.choice(("mul0", "sub_self", "div_self")), "args": [v]})
    elif op == "debug" and g.in_body in (None, "jit", "cond", "scan", "while"):
        g.add({"op": "debug", "args": [v]})
    else:
        g.add({"op": "opaque", "args": [v]})


def draw_motif(g: Builder, knobs):
    table = [m_chain, m_dup, m_near_dup, m_const, m_misc]
    table += [m_conv_bn, m_conv_bn, m_parallel_convs, m_parallel_convs] if g.layout != "dense" \
        else [m_matmul]
    g.c.choice(table)(g)


def draw_body(g: Builder, kind: str, shape) -> list:
    """A shape-preserving body (1-2 motifs) for a wrapper of ``kind``."""
    body = Builder(g.c, g.layout, [shape], in_body=kind)
    for _ in range(g.c.integer(1, 2)):
        op = g.c.choice(("unary", "scalar", "near", "bn", "conv"))
        v = body.pick(lambda s: s == shape)
        if op == "unary":
            body.unary(v)
        elif op == "scalar":
            body.add({"op": "scalar", "fn": "mul", "c": g.c.choice((0.5, 2.0)), "args": [v]})
        elif op == "near":
            a = body.add({"op": "pow", "y": 2, "args": [v]})
            body.combine(a, body.add({"op": "pow", "y": 3, "args": [v]}))
        elif g.layout != "dense":
            z = body.conv(v, out=shape[g.chan_axis()], stride=1, pad="SAME") if op == "conv" else v
            body.bn(z)
        else:
            body.add({"op": "matmul", "n": shape[1], "seed": g.c.seed(), "args": [v]})
    last = len(body.shapes) - 1
    if last == 0 or body.shapes[last] != shape:
        body.unary(body.pick(lambda s: s == shape), "tanh")
    return body.nodes


def draw_wrapper(g: Builder, knobs):
    kind = g.c.choice(WRAPPERS)
    v = g.pick_main()
    node = {"op": kind, "args": [v], "body": draw_body(g, kind, g.shapes[v]),
            "name": f"blk{len(g.nodes)}"}
    if kind == "checkpoint":
        node["policy"] = g.c.choice(POLICIES)
    w = g.add(node, g.shapes[v])
    if g.c.chance(0.3):  # the same call twice: CSE across calls, inline twice
        g.combine(w, g.add(dict(node), g.shapes[v]))
