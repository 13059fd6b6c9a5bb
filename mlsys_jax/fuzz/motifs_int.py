"""Integer, boolean and PRNG motifs (docs/verification.md §2: a generator that only draws floats cannot find
a fold that is legal only over the reals).

Integer programs reuse the float motifs with the tables below (their unary and binary functions,
and the stand-ins for float-only ones), plus what has no float analogue: truncating division,
remainder and shifts by constants, and comparisons feeding selects. Boolean programs start from
boolean inputs, turned into integer images for the convs and used as masks. Every divisor is
nonzero by construction, so no program divides by zero.
"""
from __future__ import annotations

INT_UNARY = ("neg", "abs", "square", "not", "sign", "clamp", "relu", "where_relu", "shl", "shr",
             "shr_logical")
INT_BINARY = ("add", "mul", "sub", "max", "min", "div", "rem", "and", "or", "xor", "shl", "shr")
INT_STANDIN = {"tanh": "clamp"}     # a float-only function a motif asks for by name
INT_NAN_UNSAFE = ("mul0", "sub_self")  # x/x divides by zero for integers
INT_SCALAR_DIV = ("div", "rem", "shr", "shl", "shr_logical")
CMPS = ("gt", "lt", "eq", "ne", "ge")
LOGIC = ("and", "or", "xor")
FLOAT_RNG = ("uniform", "normal_split", "fold_in", "const_key")
INT_RNG = ("randint", "bits", "fold_in")


def m_int_div(g):
    """Truncating division, remainder or a shift by a constant (divisors ±2, 3; shifts 1-3)."""
    fn = g.c.choice(INT_SCALAR_DIV)
    c = g.c.choice((2, 3, -3)) if fn in ("div", "rem") else g.c.choice((1, 2, 3))
    g.add({"op": "scalar", "fn": fn, "c": c, "args": [g.pick_main()]})


def m_select(g):
    """A comparison feeding a select, sometimes combined with a second mask by a logical op; in
    boolean programs the mask may be a boolean input itself."""
    c, main = g.c, (lambda s: s == g.shapes[0])
    p = g.pick(main, kind="bool")
    if p < 0 or c.chance(0.5):
        p = g.add({"op": "cmp", "fn": c.choice(CMPS), "args": [g.pick_main(), g.pick_main()]},
                  kind="bool")
    if c.chance(0.4):
        q = g.add({"op": "cmpc", "fn": c.choice(CMPS), "c": c.choice((0, 1, -2)),
                   "args": [g.pick_main()]}, kind="bool")
        p = g.add({"op": "logic", "fn": c.choice(LOGIC), "args": [p, q]}, kind="bool")
    if c.chance(0.2):
        p = g.add({"op": "logic", "fn": "not", "args": [p]}, kind="bool")
    g.add({"op": "select", "args": [p, g.pick_main(), g.pick_main()]}, g.shapes[0])


def m_from_bool(g):
    """Each boolean input as an integer image (a cast, or a select between two constants)."""
    for i in range(len(g.shapes)):
        g.add({"op": "from_bool", "fn": g.c.choice(("astype", "where")), "args": [i]})


def m_rng(g):
    """A random draw from the PRNG key input (or from a key made inside) added to a value: keys
    pass through every pass untouched, never folded or merged."""
    v = g.pick_main()
    fn = g.c.choice(INT_RNG if g.integer else FLOAT_RNG)
    g.add({"op": "rng", "fn": fn, "seed": g.c.integer(0, 99), "args": [v]})


def int_motifs() -> list:
    """The motifs only integer programs draw (added to the common table)."""
    return [m_select, m_select, m_int_div]
