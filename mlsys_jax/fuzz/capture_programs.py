"""Random branchy programs for the capture oracle (lecture §8.4: graph breaks; docs/verification.md §3).

A program is Python source text — printable, so a failure is its own reproducer — for a function
``f(x, y, s, w)`` of two arrays, a static Python float and a weakly typed scalar. Its body mixes
what graph-break capture must replay bitwise: elementwise chains with multiply–add pairs (where
a compiler would contract to FMA), ``log(exp(v))`` and ``v ** 3.0`` (what XLA's simplifier
rewrites), ``v + 0.0`` at ``-0.0``, transposed matmuls, ``jnp`` helpers that eager fuses inside
(``var``, ``softmax``, ``gelu``, ``erfc``, ``polyval``), a user's ``@jax.jit`` helper,
``lax.cond``, constants and PRNG keys made inside, weakly typed scalars; and the breaks:
data-dependent ``if`` on a tensor, ``float()``/``.item()``/``int()`` guards whose value flows
into later constants (signed zeros among them), and short value-dependent ``while`` loops.
Inputs hold signed zeros, tiny, subnormal and huge values.

A *stateful* program (``state_rate`` of them) also reads state outside its arguments — module
globals (a Python float, a JAX array, a NumPy array, a list), an object's attributes through a
method, a closure's list — and may have Python side effects (appends to a list, a deferred value
among them, an attribute and a global incremented, a ``print`` to a buffer). Its ``changes`` are
statements the oracle runs on the program's globals between calls (a global rebound, a NumPy
array or a list changed in place, an attribute set).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import jax
import numpy as np

DTYPES = ("float32", "float64", "float16", "bfloat16")
CONSTANTS = ("0.0", "-0.0", "1.0", "-1.0", "0.5", "3.0", "2", "1e-30", "1e30", "1e-45", "7.25")
UNARY = (
    "jnp.sin({a})", "jnp.tanh({a})", "jnp.exp(jnp.clip({a}, -20, 20))", "jnp.log(jnp.exp({a}))",
    "jnp.sqrt(jnp.abs({a}))", "jnp.abs({a})", "-{a}", "{a} ** 3.0", "{a} ** 2", "1.0 / {a}",
    "jnp.log1p(jnp.abs({a}))", "jax.nn.relu({a})", "jax.nn.sigmoid({a})", "jax.nn.gelu({a})",
    "jax.nn.gelu({a}, approximate=False)", "jax.lax.erfc({a})", "jax.nn.softplus({a})",
    "jnp.polyval(jnp.asarray([0.5, -1.0, 2.0], {a}.dtype), {a})", "jnp.cbrt({a})",
    "jax.nn.softmax({a}, axis=-1)", "{a} - jax.nn.logsumexp({a}, axis=0)", "jnp.cumsum({a}, axis=1)",
    "jnp.square({a}) + {a}", "{a} * 3 + 1", "jnp.sinc({a})", "{a}.T", "jnp.expm1({a})",
)
BINARY = (
    "{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / {b}", "jnp.maximum({a}, {b})",
    "jnp.where({a} > {b}, {a}, {b})", "{a} * {b} + {a}", "{a} @ {b}", "{a} @ {b}.T",
    "{a}.T @ {b}", "jnp.arctan2({a}, {b})", "helper({a}, {b})",
    "jax.lax.cond(({a} > 0).sum() > {n} // 2, fma_branch, add_branch, {a}, {b})",
)
WITH_CONST = ("{a} + {c}", "{a} * {c}", "{c} - {a}", "{a} / ({c} + 1.5)", "1.0 / ({a} + {c})",
              "jnp.asarray({c}, {a}.dtype) * {a}", "{a} + jnp.full({a}.shape, {c}, {a}.dtype)")
SCALARS = ("{a} * s", "{a} + s", "1.0 / ({a} * 0 + s)", "{a} * w", "w * 2 + {a}.sum()",
           "{a} + jax.random.normal(jax.random.key({k}), {a}.shape, {a}.dtype)",
           "{a} * jnp.var({a})", "{a} - {a}.mean(axis=0)", "{a} / ({a}.max() + 1.0)")

HEADER = """import jax
import jax.numpy as jnp

from mlsys_jax.fuzz.capture_programs import add_branch, fma_branch, helper


def f(x, y, s, w):
"""
# The state a stateful program reads and changes (``{n}``: its arrays' size).
STATE_SOURCE = """import io

import numpy as np

G_SCALE = 1.5
G_ARR = jnp.linspace(-1.0, 1.0, {n} * {n}, dtype=jnp.float32).reshape({n}, {n})
G_NP = np.linspace(0.5, 1.5, {n} * {n}, dtype=np.float32).reshape({n}, {n})
G_LIST = [G_ARR]
G_COUNT = 0
LOG = []
SINK = io.StringIO()


class State:
    def __init__(self):
        self.k = 2.0
        self.w = G_ARR * 0.5
        self.calls = 0

    def scaled(self, v):
        return v * self.k


STATE = State()


def make_bump():
    box = [1.0]

    def bump(v):
        return v * box[0]
    return bump, box


BUMP, BOX = make_bump()
"""
READS = ("{a} * G_SCALE", "{a} + G_ARR", "{a} * G_NP", "{a} + sum(G_LIST)", "STATE.scaled({a})",
         "{a} * STATE.w", "BUMP({a})")
EFFECTS = ("LOG.append(({a}).sum())", "LOG.append(len(LOG))", "STATE.calls += 1", "G_COUNT += 1",
           "print('called', len(LOG), file=SINK)")
CHANGES = ("G_SCALE = {c}", "G_ARR = G_ARR * {c}", "G_NP[0, 0] = {c}", "G_LIST.append(G_ARR * {c})",
           "STATE.k = {c}", "STATE.w = STATE.w + {c}", "BOX[0] = {c}")
STATE_CONSTANTS = ("0.0", "-0.0", "2.0", "-1.0", "0.5", "1e30", "7.25")


# Shared by every program (one compiled executable each per input type, for eager and capture).
@jax.jit
def helper(u, v):
    """A user's jitted multiply-add: eager fuses it into one FMA."""
    return u * v + 1.0


def fma_branch(u, v):
    """One branch a generated program may call: a multiply-add."""
    return u * v - 1.0


def add_branch(u, v):
    """The other branch a generated program may call: an add."""
    return u + v


@dataclass(frozen=True)
class CaptureProgram:
    """One generated program: its source, the dtype and shape of its array inputs, and for a
    stateful one the changes to its globals between calls."""

    seed: int
    source: str
    dtype: str
    n: int
    changes: tuple = ()

    @property
    def stateful(self) -> bool:
        """Whether the program reads module state (``G_SCALE``) that a guard must watch."""
        return "G_SCALE" in self.source

    def namespace(self) -> dict:
        """The program's globals, freshly made (a stateful program's state is its own)."""
        scope: dict = {}
        exec(compile(self.source, f"<capture program {self.seed}>", "exec"), scope)  # noqa: S102
        return scope

    def function(self):
        """The program's ``f``, from a fresh namespace (so its module state is its own)."""
        return self.namespace()["f"]

    def state(self, scope: dict):
        """What the program's side effects have done to its globals (for the oracle)."""
        if not self.stateful:
            return ()
        return (list(scope["LOG"]), scope["STATE"].calls, scope["G_COUNT"],
                scope["SINK"].getvalue())


class _Writer:
    def __init__(self, rng: np.random.Generator, n: int, state=None):
        self.rng, self.n = rng, n
        self.state = state  # the stateful program's own draws (None: not stateful)
        self.lines: list[str] = []
        self.vars = ["x", "y"]
        self.python_vals: list[str] = []
        self.count = 0

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def expr(self) -> str:
        a, b = self.pick(self.vars), self.pick(self.vars)
        if self.state is not None and self.state.random() < 0.3:
            return READS[int(self.state.integers(len(READS)))].format(a=a)
        kind = self.rng.random()
        if kind < 0.35:
            return self.pick(UNARY).format(a=a)
        if kind < 0.65:
            return self.pick(BINARY).format(a=a, b=b, n=self.n * self.n)
        if kind < 0.85:
            return self.pick(WITH_CONST).format(a=a, c=self.pick(CONSTANTS))
        return self.pick(SCALARS).format(a=a, k=int(self.rng.integers(100)))

    def assign(self, indent: str, target: str | None = None) -> str:
        target = target or self.fresh()
        # keep the program's dtype and shape: every result is cast and broadcast back
        self.lines.append(f"{indent}{target} = jnp.broadcast_to(({self.expr()}), x.shape)"
                          ".astype(x.dtype)")
        return target

    def guard(self) -> str:
        a = self.pick(self.vars)
        return self.pick((f"({a}).sum() > 0", f"float(({a})[0, 0]) > 0.25",
                          f"({a}).max() > 1.0", f"({a})[-1, -1].item() == 0.0",
                          f"jnp.isnan(({a})).any()", f"int((({a}) > 0).sum()) % 2 == 1"))

    def statement(self, indent: str = "    ") -> None:
        if self.state is not None and self.state.random() < 0.2:
            effect = EFFECTS[int(self.state.integers(len(EFFECTS)))]
            self.lines.append(indent + effect.format(a=self.pick(self.vars)))
        kind = self.rng.random()
        if kind < 0.45 or len(indent) > 4:
            self.vars.append(self.assign(indent))
        elif kind < 0.7:  # a data-dependent if: both branches assign the same variable
            target = self.fresh()
            self.lines.append(f"{indent}if {self.guard()}:")
            self.assign(indent + "    ", target)
            self.lines.append(f"{indent}else:")
            self.assign(indent + "    ", target)
            self.vars.append(target)
        elif kind < 0.85:  # a concrete value flows into later constants (signed zeros too)
            c, a = f"c{self.count}", self.pick(self.vars)
            self.lines.append(f"{indent}{c} = " + self.pick((
                f"float(({a})[0, 0] * 0.0)", f"({a})[0, -1].item()",
                f"int(jnp.abs(({a})).argmax())", f"float(({a}).sum())")))
            target = self.fresh()
            self.lines.append(f"{indent}{target} = (1.0 / ({self.pick(self.vars)} * 0 + {c}))"
                              ".astype(x.dtype)")
            self.vars.append(target)
            self.python_vals.append(c)
        else:  # a short value-dependent loop
            target, t = self.fresh(), f"t{self.count}"
            self.lines += [f"{indent}{target}, {t} = {self.pick(self.vars)}, 0",
                           f"{indent}while float(jnp.abs({target}).sum()) > 2.0 and {t} < 3:",
                           f"{indent}    {target} = ({target} * 0.5).astype(x.dtype)",
                           f"{indent}    {t} += 1"]
            self.vars.append(target)
            self.python_vals.append(t)


def generate(seed: int, max_statements: int = 6, dtypes=DTYPES, sizes=(1, 2, 3, 4),
             state_rate: float = 0.0):
    """A random branchy program (deterministic in ``seed`` and the options); ``state_rate``
    of them stateful, drawn from a stream of their own (the others are as without it)."""
    rng = np.random.default_rng([seed, 0xCA97])
    state = np.random.default_rng([seed, 0x57A7E])
    state = state if state.random() < state_rate else None
    n = int(rng.choice(sizes))
    w = _Writer(rng, n, state)
    for _ in range(int(rng.integers(2, max_statements + 1))):
        w.statement()
    outs = list(dict.fromkeys(w.vars[-1:] + [w.pick(w.vars[2:] or ["x"])]))
    outs += w.python_vals[-1:]
    body = "\n".join(w.lines) + f"\n    return ({', '.join(outs)},)\n"
    if state is None:
        return CaptureProgram(seed, HEADER + body, str(rng.choice(dtypes)), n)
    changes = tuple(CHANGES[int(state.integers(len(CHANGES)))].format(
        c=STATE_CONSTANTS[int(state.integers(len(STATE_CONSTANTS)))]) for _ in range(2))
    head, _, tail = HEADER.partition("def f(x, y, s, w):\n")
    source = f"{head}{STATE_SOURCE.format(n=n)}\n\ndef f(x, y, s, w):\n    global G_COUNT\n{tail}{body}"
    return CaptureProgram(seed, source, str(rng.choice(dtypes)), n, changes)


SPECIAL = (0.0, -0.0, 1e-45, -1e-30, 3e38, -3e38, 1.0, -1.0, 1e-3)


def inputs(program: CaptureProgram, variant: int):
    """Arguments ``(x, y, s, w)``: variant 0, and variants that flip signs (zeros included)."""
    import jax.numpy as jnp

    rng = np.random.default_rng([program.seed, 0x1A9])
    shape = (program.n, program.n)
    x, y = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 30.0]) for _ in range(2))
    for arr in (x, y):
        mask = rng.random(shape) < 0.3
        arr[mask] = rng.choice(SPECIAL, size=int(mask.sum()))
    s = float(rng.choice([1.5, 0.0, -0.0, -2.0]))
    if variant == 1:
        x, y, s = -x, -y, -s
    elif variant == 2:
        x = np.where(x == 0, -x, x) * 4.0
    dt = jnp.dtype(program.dtype)
    with warnings.catch_warnings():  # huge values overflow to inf in 16-bit dtypes: intended
        warnings.simplefilter("ignore", RuntimeWarning)
        return (jnp.asarray(x, dt), jnp.asarray(y, dt), s, jnp.asarray(float(np.abs(y).mean())))
