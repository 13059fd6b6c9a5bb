"""Random program specs: a DAG of ops with static params, and the generator (docs/verification.md §2).

A :class:`Spec` is plain data (JSON-able, printable in a reproducer): inputs, a list of nodes and
the outputs. Node ``i`` produces value ``len(inputs) + i``; a wrapper node (jit, checkpoint, cond,
scan, while, custom_jvp/vjp) has a ``body``: nodes over a local value 0 (the wrapper's argument)
whose last value is the result, shape-preserving. Constants are drawn at build time from a node's
``seed``, so a spec stays small.

The generator draws every choice through a *chooser* — NumPy for campaigns, hypothesis for
shrinking (:mod:`mlsys_jax.fuzz.strategy`). Options are listed simplest first, so hypothesis
shrinks toward small, plain programs. Each motif declares its preconditions (shapes, channels)
and is only drawn where they hold; the opportunity knobs make every pass fire.

Not only floating point (docs/verification.md §2): integer programs (integer convs followed by truncating
division or remainder, shifts, comparisons feeding selects) and boolean ones (boolean inputs,
masks, logic), so that a fold legal only over the reals is found; PRNG keys passed in as inputs;
and inputs sprinkled with NaN, ±Inf, -0.0 and subnormals (integers: their extremes).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from mlsys_jax.fuzz import motifs, motifs_int, motifs_user
from mlsys_jax.fuzz.spec_builder import Builder

LAYOUTS = ("dense", "nchw", "nhwc")
CONV_DIMS = {"nchw": ("NCHW", "OIHW", "NCHW"), "nhwc": ("NHWC", "HWIO", "NHWC")}
SHAPES = {"dense": (4, 8), "nchw": (2, 4, 6, 6), "nhwc": (2, 6, 6, 4)}
DTYPES = ("f32", "f16", "bf16", "i32", "bool")
FLOAT_DTYPES = ("f32", "f16", "bf16")


@dataclass
class Spec:
    """A random program: layout, dtype, input shapes, nodes (dicts) and output value ids.

    ``special``: the inputs carry special values (NaN, ±Inf, -0.0, subnormals; integers: INT_MIN,
    INT_MAX, 0, -1). ``keys``: PRNG key inputs after the array inputs (``rng`` nodes use them;
    they are not values of the DAG)."""

    layout: str
    dtype: str
    inputs: list
    nodes: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    special: bool = False
    keys: int = 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text) -> "Spec":
        d = json.loads(text) if isinstance(text, str) else dict(text)
        return Spec(d["layout"], d["dtype"], [list(s) for s in d["inputs"]], list(d["nodes"]),
                    list(d["outputs"]), bool(d.get("special", False)), int(d.get("keys", 0)))

    def size(self) -> int:
        """Nodes, counting wrapper bodies (what shrinking minimises)."""
        return sum(1 + len(n.get("body", ())) for n in self.nodes)


def all_ops(nodes) -> set:
    """The ops used, recursively into wrapper bodies."""
    out = set()
    for n in nodes:
        out.add(n["op"])
        out |= all_ops(n.get("body", ()))
    return out


def is_integer(spec: Spec) -> bool:
    """An integer or boolean program: every output is judged bitwise, whatever the pass."""
    return spec.dtype not in FLOAT_DTYPES


def derivative_mode(spec: Spec) -> str:
    """'vjp', or 'jvp' when a while loop forbids reverse mode, or 'none' (while + custom_vjp;
    integer programs; special inputs, whose derivatives are NaN; PRNG key inputs, which have no
    tangent)."""
    if is_integer(spec) or spec.special or spec.keys:
        return "none"
    ops = all_ops(spec.nodes)
    if "while" in ops:
        return "none" if "custom_vjp" in ops else "jvp"
    return "vjp"


class NumpyChooser:
    """Choices from a seeded NumPy generator (campaigns)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def choice(self, options):
        return options[int(self.rng.integers(len(options)))]

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def seed(self) -> int:
        return int(self.rng.integers(0, 2**31 - 1))


@dataclass
class Knobs:
    """Opportunity knobs (docs/verification.md §2): probabilities of each motif per program."""

    image: float = 0.6          # conv programs (NCHW or NHWC) rather than dense
    low_precision: float = 0.1  # f16 / bf16 programs
    integer: float = 0.15       # integer programs (i32) ...
    boolean: float = 0.3        # ... of which boolean-input programs
    special_inputs: float = 0.15  # NaN/Inf/-0.0/subnormal inputs (integers: extremes)
    keys: float = 0.1           # a PRNG key input used by random draws
    wrapper: float = 0.5
    debug: float = 0.15
    opaque: float = 0.15
    conv_motifs: float = 0.7    # image programs: chance of a parallel-conv and a conv→BN motif
    dense_motifs: float = 0.8   # dense programs: chance of a Dense→BN and an attention motif
    user: float = 0.6           # more user-style motifs (fuzz/motifs_user.py)
    square: float = 0.35        # image programs with C == H == W (a bias on any axis fits)
    dead: float = 0.5           # leave some values unused (DCE)
    min_motifs: int = 2
    max_motifs: int = 4


def generate(chooser, knobs: Knobs | None = None) -> Spec:
    """One random program spec."""
    knobs = knobs or Knobs()
    layout = chooser.choice(LAYOUTS[1:]) if chooser.chance(knobs.image) else "dense"
    if chooser.chance(knobs.integer):
        dtype = "bool" if chooser.chance(knobs.boolean) else "i32"
    else:
        dtype = chooser.choice(FLOAT_DTYPES[1:]) if chooser.chance(knobs.low_precision) else "f32"
    keys = int(chooser.chance(knobs.keys))
    shape = list(SHAPES[layout])
    if layout != "dense" and chooser.chance(knobs.square):
        shape = list(motifs_user.SQUARE)
    n_in = chooser.integer(1, 2)
    g = Builder(chooser, layout, [shape] * n_in, dtype=dtype, keys=keys)
    if dtype == "bool":  # boolean inputs become integer images for the conv motifs, and masks
        motifs_int.m_from_bool(g)
    if layout != "dense":  # the conv rewrites need conv programs: give most of them both motifs
        for motif in (motifs.m_parallel_convs, motifs.m_conv_bn):
            if chooser.chance(knobs.conv_motifs):
                motif(g)
    else:  # and the matmul rewrites Dense layers and attention
        for motif in (motifs_user.m_dense_bn, motifs_user.m_attention):
            if chooser.chance(knobs.dense_motifs) and not (g.integer and
                                                          motif is motifs_user.m_attention):
                motif(g)
    for _ in range(chooser.integer(knobs.min_motifs, knobs.max_motifs)):
        motifs.draw_motif(g, knobs)
    if chooser.chance(knobs.user):
        motifs_user.draw(g)
    if chooser.chance(knobs.debug):
        g.add({"op": "debug", "args": [g.pick()]})
    if chooser.chance(knobs.opaque):
        g.add({"op": "opaque", "args": [g.pick()]})
    if keys:
        motifs_int.m_rng(g)
    if chooser.chance(knobs.wrapper):
        motifs.draw_wrapper(g, knobs)
    outputs = g.choose_outputs(knobs.dead)
    special = dtype != "bool" and chooser.chance(knobs.special_inputs)
    return Spec(layout, dtype, [list(s) for s in g.shapes[:n_in]], g.nodes, outputs, special, keys)


def generate_seeded(seed: int, knobs: Knobs | None = None) -> Spec:
    return generate(NumpyChooser(seed), knobs)


def program_seed(campaign_seed: int, index: int) -> int:
    """The seed of program ``index`` of a campaign (so one program can be regenerated alone)."""
    return int(np.random.SeedSequence([campaign_seed, index]).generate_state(1)[0])
