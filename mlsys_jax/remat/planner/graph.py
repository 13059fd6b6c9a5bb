"""A user's loss as a recomputation graph (lecture §7.2): what each backward step reads.

The loss is traced over (*parameters, *batch) with its named calls inlined (the backward reads
values inside ``jit[name=softmax]``). Each top-level equation is linearized on its own with
``jax.vjp`` — with respect to its inputs that depend on the parameters — and the leaves of that
VJP closure are the residuals its backward reads, classified by identity in the traced jaxpr:
one of its inputs, one of its outputs, or an intermediate of its JVP (tanh's 1 − y², a relu
mask). Reverse mode composes per equation, so running these pullbacks in reverse order is the
gradient, and a plan may save or recompute any residual — JVP intermediates included, which a
names policy cannot name (under ``save_only_these_names`` JAX recomputes tanh itself to get
1 − y², even with every value saved: docs/remat.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import cost, ir
from mlsys_jax.compat import ClosedJaxpr, DropVar, Literal, bind_equation, eval_jaxpr
from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.planner.flat import FlatLoss


@dataclass(frozen=True)
class EqnVjp:
    """How an equation's backward reads its residuals, and its linearization as two jaxprs.

    ``forward`` and ``backward`` are what ``jax.vjp`` of the equation traces, traced once per
    kind of equation: a plan's segments re-bind them instead of calling ``jax.vjp`` per equation
    (at GPT-2 size, tracing a plan took as long as compiling it)."""

    active: tuple[int, ...]               # inputs differentiated (they depend on the parameters)
    leaves: tuple[tuple[str, int], ...]   # per VJP residual: ("in", i), ("out", j) or ("tmp", k)
    tmp_bytes: int                        # its JVP intermediates, saved or recomputed together
    flops: float                          # cost-model FLOPs of the equation and intermediates
    forward: ClosedJaxpr                  # non-literal inputs -> outputs, then residual leaves
    backward: ClosedJaxpr                 # residual leaves, float outputs' cotangents -> active
    #                                       inputs' cotangents

    def linearize(self, eqn, invals) -> tuple[list, list]:
        """(outputs, residual leaves) of ``eqn`` at ``invals`` (one value per invar)."""
        args = [x for v, x in zip(eqn.invars, invals) if not isinstance(v, Literal)]
        out = eval_jaxpr(self.forward.jaxpr, self.forward.consts, *args)
        return out[:len(eqn.outvars)], out[len(eqn.outvars):]

    def pull(self, eqn, leaves, cotangents: dict) -> list:
        """Cotangents of the active inputs, from the residual leaves and ``cotangents`` of the
        outputs (var -> value; a float output without one is zero)."""
        cts = [cotangents[v] if v in cotangents else jnp.zeros(v.aval.shape, v.aval.dtype)
               for v in eqn.outvars if _is_float(v.aval)]
        return eval_jaxpr(self.backward.jaxpr, self.backward.consts, *leaves, *cts)


def _is_float(aval) -> bool:
    return jnp.issubdtype(aval.dtype, jnp.inexact)


def _zero_cotangent(aval):
    return jnp.zeros(aval.shape, aval.dtype) if _is_float(aval) else \
        np.zeros(aval.shape, jax.dtypes.float0)


def eqn_vjp(eqn, invals, active):
    """Outputs of ``eqn`` and its VJP closure with respect to the inputs at ``active``."""
    def f(*act):
        vals = list(invals)
        for i, a in zip(active, act):
            vals[i] = a
        return bind_equation(eqn, vals)
    return jax.vjp(f, *[invals[i] for i in active])


def _analyse(eqn, active) -> EqnVjp:
    """Linearize one equation abstractly; classify its residual leaves by jaxpr variable."""
    avals = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
             for v in eqn.invars if not isinstance(v, Literal)]
    store = {}

    def run(*args):
        it = iter(args)
        invals = [v.val if isinstance(v, Literal) else next(it) for v in eqn.invars]
        outs, vjp = eqn_vjp(eqn, invals, active)
        leaves, store["treedef"] = jax.tree_util.tree_flatten(vjp)
        return outs, leaves
    closed = jax.make_jaxpr(run)(*avals)
    jaxpr = closed.jaxpr
    ins = [v for v in eqn.invars if not isinstance(v, Literal)]
    where_in = {v: eqn.invars.index(ins[k]) for k, v in enumerate(jaxpr.invars)}
    outs = jaxpr.outvars[:len(eqn.outvars)]
    kinds, tmp = [], 0
    for leaf in jaxpr.outvars[len(eqn.outvars):]:
        if not isinstance(leaf, Literal) and leaf in where_in:
            kinds.append(("in", where_in[leaf]))
        elif not isinstance(leaf, Literal) and leaf in outs:
            kinds.append(("out", outs.index(leaf)))
        else:
            kinds.append(("tmp", sum(k == "tmp" for k, _ in kinds)))
            tmp += ir.aval_bytes(leaf.aval)
    flops = sum(cost.eqn_cost(e).flops for e in jaxpr.eqns)
    n_leaves = len(jaxpr.outvars) - len(eqn.outvars)
    floats = [j for j, v in enumerate(eqn.outvars) if _is_float(v.aval)]

    def back(*args):
        pull = jax.tree_util.tree_unflatten(store["treedef"], list(args[:n_leaves]))
        cts = [_zero_cotangent(v.aval) for v in eqn.outvars]
        for j, c in zip(floats, args[n_leaves:]):
            cts[j] = c
        return pull(cts)
    struct = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)  # noqa: E731
    backward = jax.make_jaxpr(back)(*[struct(v.aval) for v in jaxpr.outvars[len(eqn.outvars):]],
                                    *[struct(eqn.outvars[j].aval) for j in floats])
    return EqnVjp(tuple(active), tuple(kinds), tmp, float(flops), closed, backward)


@dataclass(frozen=True)
class LossGraph:
    """Top-level values of the loss jaxpr in equation order, and each equation's backward."""

    closed: ClosedJaxpr          # over (*diff, *batch), named calls inlined
    n_diff: int
    vjps: tuple                  # per equation: EqnVjp, or None (no parameter dependence)
    names: tuple[str, ...]       # per value: ``{primitive}_{eqn}`` (``.j``: j-th of several)
    shapes: tuple[str, ...]
    eqn_of: np.ndarray           # the equation producing each value
    nbytes: np.ndarray
    last_use: np.ndarray         # last equation reading each value (-1: none)
    value_of: dict               # jaxpr Var -> value index
    eqn_flops: np.ndarray        # FLOPs of recomputing each equation (outputs and intermediates)

    @property
    def n_eqns(self) -> int:
        return len(self.closed.jaxpr.eqns)

    @property
    def n_values(self) -> int:
        return len(self.names)

    def start_env(self, diff, batch) -> dict:
        jaxpr = self.closed.jaxpr
        env = dict(zip(jaxpr.constvars, self.closed.consts))
        env.update(zip(jaxpr.invars, list(diff) + list(batch)))
        return env

    @staticmethod
    def read(env: dict, var):
        return var.val if isinstance(var, Literal) else env[var]

    def run(self, eqns, env: dict) -> None:
        """Evaluate ``eqns`` (equations of this jaxpr) into ``env``: plain JAX code."""
        for eqn in eqns:
            outs = bind_equation(eqn, [self.read(env, v) for v in eqn.invars])
            env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, DropVar))


def _inlined(flat: FlatLoss) -> ClosedJaxpr:
    from mlsys_jax.passes import inline, run   # same layer: the verified inlining pass

    closed = flat.closed if flat.closed is not None else \
        jax.make_jaxpr(flat.fn)(flat.diff, flat.batch)
    if closed.effects:
        effects = ", ".join(map(str, closed.effects))
        raise MlsysError(f"remat: loss_fn has side effects ({effects}); recomputation would "
                         "repeat them. Remove debug prints and callbacks")
    return run(inline(), closed, verify=False, cost=False).jaxpr


def _cache_key(eqn, active):
    try:
        key = (eqn.primitive, tuple(sorted(eqn.params.items())), active,
               tuple(v.val if isinstance(v, Literal) else v.aval for v in eqn.invars))
        hash(key)
        return key
    except TypeError:
        return None


def loss_graph(flat: FlatLoss) -> LossGraph:
    """Trace ``flat`` and linearize each equation that depends on the parameters."""
    closed = _inlined(flat)
    jaxpr = closed.jaxpr
    live = set(jaxpr.invars[:len(flat.diff)])     # values that depend on the parameters
    vjps, cache, value_of, names, values = [], {}, {}, [], []
    for i, eqn in enumerate(jaxpr.eqns):
        active = tuple(k for k, v in enumerate(eqn.invars) if not isinstance(v, Literal)
                       and v in live)
        floats = [v for v in eqn.outvars if jax.dtypes.issubdtype(v.aval.dtype, np.inexact)]
        info = None
        if active and floats:
            key = _cache_key(eqn, active)
            info = cache.get(key) if key is not None else None
            if info is None:
                info = _analyse(eqn, active)
                if key is not None:
                    cache[key] = info
            live.update(floats)
        vjps.append(info)
        for j, v in enumerate(eqn.outvars):
            if not isinstance(v, DropVar):
                value_of[v] = len(values)
                several = f".{j}" if len(eqn.outvars) > 1 else ""
                names.append(f"{eqn.primitive.name}_{i}{several}")
                values.append((i, v))
    last_use = np.full(len(values), -1, dtype=np.int64)
    for i, eqn in enumerate(jaxpr.eqns):
        for w in eqn.invars:
            if not isinstance(w, Literal) and w in value_of:
                last_use[value_of[w]] = i
    eqn_flops = np.array([v.flops if v is not None else cost.eqn_cost(e).flops
                          for e, v in zip(jaxpr.eqns, vjps)], dtype=np.float64)
    return LossGraph(closed, len(flat.diff), tuple(vjps), tuple(names),
                     tuple(v.aval.str_short(short_dtypes=True) for _, v in values),
                     np.array([i for i, _ in values], dtype=np.int64),
                     np.array([ir.aval_bytes(v.aval) for _, v in values], dtype=np.float64),
                     last_use, value_of, eqn_flops)
