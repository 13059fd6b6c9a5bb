"""Generator motifs: small node patterns that give each pass something to do (docs/verification.md §2).

Each motif checks its precondition (a value of the right rank, channels divisible by groups, an
output window of at least one pixel) before it emits nodes, so every spec traces. The same motifs
build integer programs (their functions and constants drawn from the integer tables of
:mod:`mlsys_jax.fuzz.motifs_int`, which also holds the integer-only motifs).
"""
from __future__ import annotations

from mlsys_jax.fuzz.spec_builder import Builder
from mlsys_jax.fuzz.motifs_int import INT_NAN_UNSAFE, int_motifs, m_rng
from mlsys_jax.passes.rules import fold_conv_bn, merge_parallel_convs

WRAPPERS = ("jit", "checkpoint", "cond", "scan", "while", "custom_jvp", "custom_vjp")
POLICIES = (None, "nothing_saveable", "everything_saveable", "dots_saveable")
# the conv rules' motifs live beside their rules (passes/rules/); programs open with them
m_conv_bn, m_parallel_convs = fold_conv_bn.motif, merge_parallel_convs.motif

# ---- motifs ------------------------------------------------------------------------------

def m_chain(g: Builder):
    """Elementwise chain whose head has several consumers (fusion and CSE food)."""
    v = g.pick_main()
    head = g.unary(v)
    a = g.unary(head)
    if g.c.chance(0.5):
        a = g.add({"op": "scalar", "fn": g.c.choice(("add", "mul", "sub")),
                   "c": g.number((0.5, 2.0, -1.0, 3.0), (2, 3, -1, 5)), "args": [a]})
    b = g.unary(head)
    g.combine(a, b)


def m_dup(g: Builder):
    """An exact duplicate of an earlier pure node (CSE must merge it)."""
    n_in = len(g.shapes) - len(g.nodes)
    cands = [i for i, n in enumerate(g.nodes) if n["op"] in ("unary", "scalar", "pow", "binary",
                                                              "conv", "matmul", "jit")
             and g.kinds[n_in + i] == g.main]
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
        a = g.add({"op": "scalar", "fn": "mul", "c": g.number((2.0,), (2,)), "args": [v]})
        b = g.add({"op": "scalar", "fn": "mul", "c": g.number((3.0,), (3,)), "args": [v]})
        g.combine(a, b)


def m_const(g: Builder):
    """A constant subgraph (captured array through a few ops) combined with a value, or a weak
    scalar computed from Python floats (folding must keep weak_type)."""
    v = g.pick_main()
    if g.c.chance(0.5):
        k = g.add({"op": "const", "fn": g.number(("sin", "affine", "square"),
                                                 ("div", "affine", "square")),
                   "shape": g.shapes[v], "seed": g.c.seed(), "args": []}, g.shapes[v])
        g.combine(v, k)
    else:
        s = g.add({"op": "wconst", "fn": g.number(("cos", "exp"), ("double", "half")),
                   "c": g.number((0.5, 1.5, -2.0), (3, -7, 5)), "args": []}, [])
        if g.c.chance(0.5):
            g.forced.append(s)
        g.combine(v, s)


def m_matmul(g: Builder):
    v = g.pick(lambda s: len(s) == 2)
    g.add({"op": "matmul", "n": g.shapes[v][1], "seed": g.c.seed(), "args": [v]})


def m_misc(g: Builder):
    v = g.pick_main()
    op = g.c.choice(("debug", "opaque", "nan_unsafe"))
    if op == "nan_unsafe":
        fns = INT_NAN_UNSAFE if g.integer else ("mul0", "sub_self", "div_self")
        g.add({"op": "nan_unsafe", "fn": g.c.choice(fns), "args": [v]})
    elif op == "debug" and g.in_body in (None, "jit", "cond", "scan", "while"):
        g.add({"op": "debug", "args": [v]})
    else:
        g.add({"op": "opaque", "args": [v]})


def rule_motifs(layout: str) -> list:
    """The registered rules' motifs for programs of ``layout``, each as often as its weight."""
    from mlsys_jax.passes import registry

    return [e.rule.motif for e in registry.PASSES.values()
            if e.rule is not None and e.rule.motif is not None and layout in e.rule.motif_layouts
            for _ in range(e.rule.motif_weight)]


def draw_motif(g: Builder, knobs):
    table = [m_chain, m_dup, m_near_dup, m_const, m_misc] + rule_motifs(g.layout)
    if g.layout == "dense":
        table.append(m_matmul)
    if g.integer:
        table += int_motifs()
    g.c.choice(table)(g)


def draw_body(g: Builder, kind: str, shape) -> list:
    """A shape-preserving body (1-2 motifs) for a wrapper of ``kind``."""
    body = Builder(g.c, g.layout, [shape], in_body=kind, dtype=g.main, keys=g.keys)
    rng = g.keys and kind not in ("custom_jvp", "custom_vjp")  # their rules see no closure
    ops = ("unary", "scalar", "near", "bn", "conv") + (("rng",) if rng else ())
    for _ in range(g.c.integer(1, 2)):
        op = g.c.choice(ops)
        v = body.pick(lambda s: s == shape)
        if op == "unary":
            body.unary(v)
        elif op == "rng":  # the key crosses into the wrapper's body (a closed-over input)
            m_rng(body)
        elif op == "scalar":
            body.add({"op": "scalar", "fn": "mul", "c": g.number((0.5, 2.0), (2, 3)),
                      "args": [v]})
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
