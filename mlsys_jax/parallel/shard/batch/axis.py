"""Following the batch axis through a loss's jaxpr: which equations mix examples (§5.1).

Data parallelism equals one device when the loss is the mean of per-example terms: then each
shard's mean, averaged, is the batch's mean. :func:`follow_batch` decides that from the dataflow,
as ``vmap``'s batching rules follow a mapped axis: every value is given a *state* —

* :class:`Rows`: per-example values, the example index running along one dimension;
* :class:`Summed`: a linear sum over every example (the final mean's ``reduce_sum``);
* :class:`Free`: independent of the batch (parameters, constants, iota, random bits drawn from
  a key the loss holds), with the dimensions along which it is not uniform;
* :class:`Mixed`: depends on several examples in another way —

and each equation that turns rows into something else than a linear sum is recorded as a
:class:`Mixing` with its kind, its place (equation path, module, source line) and one sentence:
a batch statistic used per example (training BatchNorm, inputs centred by the batch mean), a
loss normalised by a batch-wide sum (a count of non-padding tokens), a nonlinear reduction, sort
or cumulative op along the batch, examples paired by a matmul, rows selected or reordered, rows
combined with values that depend on their *position* in the batch (dropout masks from a fixed
key), control flow decided by the batch. The per-primitive rules and the walk itself
(``follow_batch``) are ``rules.py``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import jax
import jaxlib

from mlsys_jax.compat import Literal
from mlsys_jax.ir import bodies


@dataclass(frozen=True)
class Rows:
    """Per-example values: the example index of element ``i`` along ``dim`` is
    ``(i // inner) % batch`` (``inner`` > 1 after the batch axis is merged with a later one)."""

    dim: int
    inner: int = 1


@dataclass(frozen=True)
class Summed:
    """A linear function of a sum over every example; ``origin`` indexes ``BatchWalk.sums``.
    ``synced``: the sum was completed across devices by a collective over a bound axis name."""

    origin: int
    synced: bool = False


@dataclass(frozen=True)
class Stat:
    """A nonlinear function of batch-wide sums (a variance, a sum divided by a count): one value
    for the whole batch. ``kind``, ``eqn``, ``path``: how and where it became nonlinear."""

    origin: int
    synced: bool
    kind: str
    eqn: object = field(compare=False, repr=False)
    path: str = ""


@dataclass(frozen=True)
class Mixed:
    """Depends on several examples through ``BatchWalk.mixing[cause]``."""

    cause: int


@dataclass(frozen=True)
class Free:
    """Independent of the batch; ``varying``: dimensions along which the value is not uniform;
    ``random``: drawn from random bits."""

    varying: frozenset = frozenset()
    random: bool = False


KINDS = {
    "statistic": "a batch statistic is used per example",
    "normaliser": "the loss is normalised by a batch-wide sum",
    "nonlinear": "a nonlinear function of a batch-wide sum",
    "reduction": "a nonlinear reduction along the batch axis",
    "order": "examples are sorted, reordered or accumulated along the batch axis",
    "pairs": "examples are combined with each other",
    "selection": "rows are selected, padded or concatenated along the batch axis",
    "position": "examples are combined with values that depend on their position in the batch",
    "control": "control flow depends on the batch",
    "unfollowed": "the batch axis could not be followed",
}


@dataclass(frozen=True)
class Mixing:
    """One equation that mixes examples."""

    kind: str            # a key of KINDS
    primitive: str
    path: str            # the equation path (ir.walk's format)
    where: str           # the module (name stack) and source line
    detail: str          # one sentence
    origin: int | None = None   # the batch-wide sum involved (index into sums), if any
    random: bool = False        # position kind: the values are random bits
    synced: bool = False        # statistic kind: completed across devices (synchronised)
    trace: str = ""             # every module and source file on the way (for naming causes)

    def describe(self) -> str:
        return f"{self.detail} ({self.primitive} at {self.path}{', ' + self.where if self.where else ''})"


@dataclass(frozen=True)
class BatchSum:
    """Where a batch-wide sum was formed, and the top-level variable first holding it."""

    primitive: str
    path: str
    where: str
    eqn: object
    top_var: object = None


@dataclass
class BatchWalk:
    """The result: every mixing equation, every batch-wide sum, and the loss output's state."""

    batch: int
    mixing: list = field(default_factory=list)
    sums: list = field(default_factory=list)
    output: object = None
    producers: dict = field(default_factory=dict)   # var -> (eqn, path) at the top level
    axes: dict = field(default_factory=dict)        # batch invar -> the axis holding examples
    calls: list = field(default_factory=list)       # the call equations being walked into

    def where(self, eqn) -> str:
        """``where_of`` the equation, or of the innermost call around it that says more (a
        traceback recorded inside a jit body stops at the body)."""
        for e in [eqn, *reversed(self.calls)]:
            got = where_of(e)
            if ":" in got:
                return got
        return where_of(eqn)

    def record(self, kind: str, eqn, path: str, detail: str, **extra) -> Mixed:
        """Record a mixing equation (once per kind and path: loop bodies are walked again)."""
        for i, m in enumerate(self.mixing):
            if (m.kind, m.path) == (kind, path):
                return Mixed(i)
        where = extra.pop("where", None) or self.where(eqn)
        trace = extra.pop("trace", None) or " ".join(trace_of(e) for e in [eqn, *self.calls])
        self.mixing.append(Mixing(kind, eqn.primitive.name, path, where, detail, trace=trace,
                                  **extra))
        return Mixed(len(self.mixing) - 1)

    def new_sum(self, eqn, path: str) -> Summed:
        for i, s in enumerate(self.sums):
            if s.path == path:
                return Summed(i)
        self.sums.append(BatchSum(eqn.primitive.name, path, self.where(eqn), eqn))
        return Summed(len(self.sums) - 1)

    @property
    def linear(self) -> bool:
        """No mixing beyond linear batch-wide sums (synchronised statistics aside)."""
        return all(m.synced for m in self.mixing)

    def kinds(self) -> list:
        return sorted({m.kind for m in self.mixing if not m.synced})

    @property
    def shown_mixing(self) -> list:
        """The equations the walk shows mixing examples: neither a synchronised statistic (the
        mesh computes it globally) nor one it could not follow (that one is unknown)."""
        return [m for m in self.mixing if not m.synced and m.kind != "unfollowed"]


_JAX_FILES = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, jaxlib))
# files that only bind a library's primitive: the line that called them says more
_BINDERS = (os.path.join("equinox", "_unvmap.py"),)
_OURS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))) + os.sep  # mlsys_jax/


def where_of(eqn) -> str:
    """The module that made an equation (flax's name stack) and the innermost source line
    outside JAX and mlsys_jax, e.g. ``BNMLP/BatchNorm_0, normalization.py:123``."""
    stack = str(getattr(eqn.source_info, "name_stack", "") or "")
    line = ""
    tb = getattr(eqn.source_info, "traceback", None)
    for frame in getattr(tb, "frames", ()) or ():
        name = os.path.abspath(frame.file_name)
        if name.startswith(_JAX_FILES) or name.startswith(_OURS) or name.endswith(_BINDERS):
            continue
        line = f"{os.path.basename(name)}:{frame.line_num}"
        break
    return ", ".join(p for p in (stack, line) if p)


def trace_of(eqn) -> str:
    """The name stack and every source file outside JAX that made an equation."""
    tb = getattr(eqn.source_info, "traceback", None)
    files = [os.path.basename(f.file_name) for f in getattr(tb, "frames", ()) or ()
             if not os.path.abspath(f.file_name).startswith(_JAX_FILES)]
    return " ".join([str(getattr(eqn.source_info, "name_stack", "") or "")] + files)


def join(a, b):
    """The state of a value that may be ``a`` or ``b`` (loop carries, cond branches)."""
    if a == b:
        return a
    for s in (a, b):
        if isinstance(s, Mixed):
            return s
    if isinstance(a, Free) and isinstance(b, Free):
        return Free(a.varying | b.varying, a.random or b.random)
    if isinstance(a, Free) or isinstance(b, Free):
        return b if isinstance(a, Free) else a
    if isinstance(a, (Summed, Stat)) and isinstance(b, (Summed, Stat)):
        return a if isinstance(a, Stat) else b
    return None   # rows meeting something else: the caller records it


def free_of(v) -> Free:
    shape = getattr(v.aval, "shape", ())
    return Free(frozenset(d for d, s in enumerate(shape) if s > 1))


def state_of(env: dict, v):
    """The state of an equation input: a literal is free and uniform."""
    return Free() if isinstance(v, Literal) else env[v]


def call_body(eqn):
    """The body of a call whose outputs are that body's outputs on its inputs, or None."""
    found = bodies(eqn)
    return found[0] if len(found) == 1 else None
