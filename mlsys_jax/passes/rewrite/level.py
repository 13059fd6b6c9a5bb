"""What a rule sees and how it writes: one jaxpr level (:class:`Level`) and the replacement's
arithmetic (:class:`Emit`), in the program's dtypes or in float64."""
from __future__ import annotations

from functools import partial
from typing import Callable

import jax
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, Literal, Tracer, bind_equation
from mlsys_jax.ir.consts import Consts
from mlsys_jax.ir.opview import consumers
from mlsys_jax.ir.rebatch import rebind
from mlsys_jax.ir.widen import literal_value, widen_dtype, widen_value
from mlsys_jax.passes import feature_cut
from mlsys_jax.passes.validate import approximate


class Level:
    """One jaxpr level: its equations, the values known before it runs (``ir.consts``), who reads
    each value (equation indices, -1 for an output of the level), where each is defined, and the
    path prefix its equations are logged with (``ir.walk``'s format)."""

    def __init__(self, jaxpr, consts=(), path: str = "", known: dict | None = None,
                 nested: bool | None = None):
        if isinstance(jaxpr, ClosedJaxpr):
            jaxpr, consts = jaxpr.jaxpr, jaxpr.consts
        self.jaxpr, self.eqns, self.path = jaxpr, jaxpr.eqns, path
        self.consts = Consts(jaxpr, consts, known, nested=bool(path) if nested is None else nested)
        self.producer = self.consts.producer
        self.users = consumers(jaxpr)
        self.defined = {v: i for i, e in enumerate(jaxpr.eqns) for v in e.outvars}

    @property
    def nested(self) -> bool:
        return self.consts.nested

    def value(self, v):
        """The known value of atom ``v`` (a literal or a constant), else None."""
        return self.consts.value(v)

    def known(self, v) -> bool:
        return isinstance(v, Literal) or self.value(v) is not None

    def where(self, i: int) -> str:
        return f"{self.path}{i}"

    def single_use(self, v, by: int) -> bool:
        """``v`` is read by equation ``by`` only (once), not by other equations or as an output."""
        return self.users.get(v, []) == [by]


class Emit:
    """How a rule computes its replacement. In the program's dtypes it is the rewrite itself
    (values are constants or tracers of the new jaxpr); widened (``ir.widen``) it is what the
    rewrite means in float64, for translation validation. Rules read values, dtypes and bind
    equations through it, so one emit function serves both. Validated on a cut of the site's
    output features (``passes/feature_cut.py``), its weights and bias read cut, and a rule's own
    feature-shaped vectors go through :meth:`features`."""

    def __init__(self, level: Level, read: Callable, widen: bool = False,
                 concrete: bool = False, cut=None, memo: dict | None = None):
        self.level, self.read, self.widen, self.cut = level, read, widen, cut
        self.concrete = concrete or widen  # validating: values are arrays, nothing is traced
        self.memo = memo

    def once(self, key, compute: Callable):
        """``compute()``, computed once per ``key``, precision and cut among the emits that share
        ``memo`` (validation's runs of one replacement and the rewrite itself: what the rule
        computes from constants alone, a fold's scaled kernel, is the same for every draw, and
        the rewrite ships the bits validated); every time without one."""
        if self.memo is None:
            return compute()
        cut = None if self.cut is None else (self.cut.size, tuple(np.asarray(self.cut.keep)))
        key = (key, self.widen, cut)
        if key in self.memo:
            return self.memo[key]
        got = compute()
        if not any(isinstance(x, (Tracer, feature_cut.TracedValue))
                   for x in jax.tree_util.tree_leaves(got)):  # (a trace's values are its own)
            self.memo[key] = got
        return got

    @staticmethod
    def shipped(memo: dict) -> dict:
        """What of ``memo`` the rewrite reads: the program's dtypes, whole (the widened and cut
        values of a validation are let go, not held until the pass ends)."""
        return {k: x for k, x in memo.items() if not k[1] and k[2] is None}

    def value(self, v, widened: bool = True):
        """Atom ``v``'s value: a known constant's (widened when widening, unless not
        ``widened``: as the program holds it, for arithmetic that widens each element itself,
        exactly, as a fold's float64 scaling of its weights does), else ``read(v)``."""
        if isinstance(v, Literal):
            return literal_value(v, self.widen)
        known = self.level.value(v)
        if known is None:
            return self.read(v)
        if self.cut is not None:
            known = self.cut.constant(v, known)
        if self.widen and widened:
            return widen_value(known)
        return np.asarray(known) if self.concrete else known

    def features(self, vec):
        """A feature-shaped vector of the rule's own (a folded scale or shift) as this emit
        reads the site's features: cut like them on a cut, else as it is."""
        return vec if self.cut is None else self.cut.vector(vec)

    def dtype(self, v):
        """The dtype ``v`` has here: its own, or float64 for a float when widening."""
        dt = np.dtype(v.aval.dtype) if not hasattr(v, "dtype") else np.dtype(v.dtype)
        return widen_dtype(dt) if self.widen else dt

    def call(self, fn, *args):
        """``fn(*args)`` as one named op of the rewrite (``jax.jit``: ``conv_bias``); run directly
        when validating (a fresh jit per rewrite would compile once per call)."""
        return fn(*args) if self.concrete else jax.jit(fn)(*args)

    def bind(self, eqn, args, **param_overrides) -> list:
        """``eqn`` (its params updated by ``param_overrides``) bound on ``args``."""
        if param_overrides:
            eqn = eqn.replace(params={**eqn.params, **param_overrides})
        if self.concrete:  # validating, maybe on fewer examples or features than the program has
            picks = None if self.cut is None else self.cut.picks
            outs = rebind(eqn, list(args), partial(approximate, widen=self.widen), picks)
            return [_host(o) for o in outs]  # what the rule computes next: NumPy's
        return bind_equation(eqn, args)


def _host(x):
    """A computed array as NumPy holds it (PRNG keys as they are)."""
    if isinstance(x, jax.Array) and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended):
        return np.asarray(x)
    return x
