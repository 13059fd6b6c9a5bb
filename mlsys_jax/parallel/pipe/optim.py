"""The user's optax optimizer, run per stage on the user's own tree, exactly as on one device.

Each stage runs ``optimizer.update`` on its *view* of the tree (``placement.StageLeaves``): its
own leaves, its rows of cut leaves, the replicated leaves, and every other stage's leaf as an
empty array — so masks, per-leaf rules and the tree structure are the user's. What a per-stage
update would get wrong is a reduction *across* stages (``clip_by_global_norm``'s norm, a mean
over a cut leaf). So the update is traced once on the whole tree and once on each stage's view:
the jaxprs line up equation by equation (only shapes differ), and an axis whose size differs
between them is a *view axis*. An equation that reduces view axes away (a sum, max or min, or a
matmul contracting them) is an *exchange*: each stage computes its part (an empty view
contributes the reduction's identity) and ``psum``/``pmax``/``pmin`` over ``pipe`` makes it the
whole tree's. Literals come from the whole-tree trace (a mean divides by the whole leaf's size).
The update then runs in rounds: each round every stage computes up to the next exchanges, then
they are exchanged (``clip_by_global_norm``: one round of scalars, then the update).

An update that moves data along a cut leaf's rows (a slice, sort or cumulative sum over them) or
whose code branches on shapes (the traces do not line up) is refused with a one-line error.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax

from mlsys_jax.compat import Literal, bind_equation
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.primitives import ELEMENTWISE
from mlsys_jax.parallel.pipe.branches import stage_switch
from mlsys_jax.parallel.pipe.flat import FlatLayout, padded_family
from mlsys_jax.parallel.pipe.optim_batch import _input_kind, chain_groups, run_position
from mlsys_jax.parallel.pipe.placement import StageLeaves

EXCHANGES = {"reduce_sum": lax.psum, "dot_general": lax.psum, "reduce_max": lax.pmax,
             "reduce_min": lax.pmin}
# What an update may do to a value cut by rows besides exchanges: per-element work and relabels.
ALONG_ROWS = ELEMENTWISE | {"broadcast_in_dim", "reshape", "transpose", "squeeze",
                            "expand_dims", "reduce_sum", "reduce_max", "reduce_min"}


def update_function(optimizer):
    """The optimizer step as one function ``(grads, state, params) -> (params, state)``."""
    def update(grads, state, params):
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state
    return update


def _structs(avals):
    return [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in avals]


class _Empty:
    """Another stage's part of a leaf: zero elements, never computed (materialised on use)."""

    def __init__(self, aval):
        self.aval = aval


_IDENTITY = {"reduce_sum": 0, "dot_general": 0, "reduce_max": -np.inf, "reduce_min": np.inf}


def _materialise(x):
    return jnp.zeros(x.aval.shape, x.aval.dtype) if isinstance(x, _Empty) else x


def _of_empties(eqn, invals):
    """A reduction of nothing but empty parts is its identity: a constant, no computation."""
    name = eqn.primitive.name
    if name in _IDENTITY and all(isinstance(x, _Empty) for x, v in zip(invals, eqn.invars)
                                 if not isinstance(v, Literal)):
        return [np.full(v.aval.shape, _IDENTITY[name], v.aval.dtype) for v in eqn.outvars]
    return None


class PartitionedOptimizer:
    """The optimizer's update as per-stage rounds with exchanges (see the module docstring)."""

    def __init__(self, optimizer, treedef, leaves: StageLeaves):
        if not isinstance(optimizer, optax.GradientTransformation):
            raise MlsysError(f"optimizer: expected an optax GradientTransformation (e.g. "
                             f"optax.adamw(1e-3)), got {type(optimizer).__name__}")
        self.leaves, self.treedef, self.stages = leaves, treedef, leaves.stages
        update = update_function(optimizer)

        def trace(avals):  # nested jit calls inlined: a norm inside a jit is an exchange too
            tree = jax.tree.unflatten(treedef, _structs(avals))
            state = jax.eval_shape(optimizer.init, tree)
            with jax.disable_jit():
                return jax.make_jaxpr(update)(tree, state, tree), state

        self.whole, state = trace(leaves.avals)
        self.state_treedef = jax.tree.structure(state)
        self.state_avals = [jax.typeof(x) if not hasattr(x, "shape") else x
                            for x in jax.tree.leaves(state)]
        self.views, view_states = [], []
        for s in range(self.stages):
            v, st = trace(leaves.view_avals(s))
            if jax.tree.structure(st) != self.state_treedef:
                raise MlsysError("optimizer: its state's structure depends on the parameters' "
                                 "shapes, so it cannot run per pipeline stage")
            self.views.append(v)
            view_states.append(jax.tree.leaves(st))
        self._check_aligned()
        self.state_rules = [self._state_rule(i, [vs[i] for vs in view_states])
                            for i in range(len(self.state_avals))]
        self.state_layouts = padded_family([FlatLayout(vs) for vs in view_states])
        self._find_exchanges()
        self.groups = [chain_groups(v.jaxpr, self._literal) for v in self.views]

    def _literal(self, i: int, j: int):
        """The literal equation i reads as input j: the whole tree's (a mean divides by the
        whole leaf's size, not by a view's)."""
        return self.whole.jaxpr.eqns[i].invars[j]

    # -- analysis -----------------------------------------------------------------------------
    def _check_aligned(self) -> None:
        w = self.whole.jaxpr
        for s, v in enumerate(self.views):
            v = v.jaxpr
            same = len(v.eqns) == len(w.eqns) and all(
                a.primitive == b.primitive and len(a.invars) == len(b.invars) and
                all(isinstance(x, Literal) == isinstance(y, Literal)
                    for x, y in zip(a.invars, b.invars)) for a, b in zip(v.eqns, w.eqns))
            if not same:
                raise MlsysError(f"optimizer: its update on stage {s + 1}'s part of the tree is "
                                 "not the whole tree's update with other shapes (its code "
                                 "branches on parameter shapes), so it cannot run per stage; use "
                                 "an optimizer such as optax.adamw or optax.sgd")

    @staticmethod
    def _axes(full, sizes) -> tuple[frozenset, frozenset]:
        """Of a value whose shape is ``full`` on the whole tree and ``sizes`` on the views: the
        axes whose size differs (view axes), and those some stage holds only part of (cut)."""
        view = frozenset(d for d in range(len(full)) if any(z[d] != full[d] for z in sizes))
        return view, frozenset(d for d in view if any(0 < z[d] < full[d] for z in sizes))

    def _view_axes(self, i: int, j: int) -> tuple[frozenset, frozenset]:
        """:meth:`_axes` of equation i's output j."""
        return self._axes(self.whole.jaxpr.eqns[i].outvars[j].aval.shape,
                          [v.jaxpr.eqns[i].outvars[j].aval.shape for v in self.views])

    def _find_exchanges(self) -> None:
        w = self.whole.jaxpr
        axes = {v: self._axes(v.aval.shape, [x.jaxpr.invars[k].aval.shape for x in self.views])
                for k, v in enumerate(w.invars)}
        rnd = {v: 0 for v in w.invars}
        self.exchange, self.round_of = {}, []
        for i, e in enumerate(w.eqns):
            ins = [x for x in e.invars if not isinstance(x, Literal)]
            in_view = any(axes.get(x, (frozenset(),))[0] for x in ins)
            in_cut = any(axes.get(x, (frozenset(), frozenset()))[1] for x in ins)
            r = max([rnd.get(x, 0) for x in ins], default=0)
            outs = [self._view_axes(i, j) for j in range(len(e.outvars))]
            name = e.primitive.name
            if in_cut and name not in ALONG_ROWS and name != "dot_general":
                raise MlsysError(f"optimizer: its update applies {name} along the rows of a "
                                 "parameter cut between pipeline stages (a stacked layer's "
                                 "slices); that is not per-element work, so it cannot run per "
                                 "stage")
            if in_view and not any(o[0] for o in outs):
                if name not in EXCHANGES:
                    raise MlsysError(f"optimizer: its update reduces whole parameters with "
                                     f"{name}, which cannot be combined across pipeline stages")
                self.exchange[i] = EXCHANGES[name]
                r += 1
            self.round_of.append(r)
            for x, o in zip(e.outvars, outs):
                axes[x], rnd[x] = o, r
        self.rounds = max([rnd.get(x, 0) for x in w.outvars
                           if not isinstance(x, Literal)], default=0)

    def _state_rule(self, i: int, view_avals):
        full = self.state_avals[i].shape
        shapes = [tuple(a.shape) for a in view_avals]
        if all(z == tuple(full) for z in shapes):
            return ("full",)
        if full and all(z[1:] == tuple(full[1:]) for z in shapes) and \
                sum(z[0] for z in shapes) == full[0]:
            starts = np.cumsum([0] + [z[0] for z in shapes])
            return ("rows", tuple(zip(starts[:-1].tolist(), starts[1:].tolist())))
        raise MlsysError(f"optimizer: state leaf {i} has shape {tuple(full)} on one device but "
                         f"{shapes} on the stages, not its parameter's parts; use an optimizer "
                         "whose state is shaped like the parameters (optax.adamw, sgd, ...)")

    # -- the state on the host ----------------------------------------------------------------
    def state_to_stages(self, state) -> list[dict]:
        """NumPy: per-stage state buffers of a one-device optimizer state."""
        leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
        out = []
        for s in range(self.stages):
            vals = [x if r[0] == "full" else x[r[1][s][0]: r[1][s][1]]
                    for x, r in zip(leaves, self.state_rules)]
            out.append(self.state_layouts[s].pack_host(vals))
        return out

    def state_from_stages(self, buffers: list[dict]):
        """NumPy: the one-device optimizer state from per-stage buffers (stage 0's copy of a
        leaf every stage holds whole)."""
        per = [self.state_layouts[s].unpack_host(buffers[s]) for s in range(self.stages)]
        leaves = [per[0][i] if r[0] == "full" else np.concatenate([p[i] for p in per])
                  for i, r in enumerate(self.state_rules)]
        return jax.tree.unflatten(self.state_treedef, leaves)

    # -- traced, per device -------------------------------------------------------------------
    def _needed(self, s: int, targets) -> set:
        """Equations that ``targets`` (equation indices) need, exchanges already made cut off."""
        view = self.views[s].jaxpr
        made = {v: i for i, e in enumerate(view.eqns) for v in e.outvars}
        need, stack = set(), list(targets)
        while stack:
            i = stack.pop()
            if i in need:
                continue
            need.add(i)
            if i in self.exchange and i not in targets:
                continue  # its value comes from an earlier round's exchange
            stack += [made[v] for v in view.eqns[i].invars
                      if not isinstance(v, Literal) and v in made]
        return need

    def _batched_positions(self, s: int, need: set) -> dict:
        """``{equation: (group, k)}`` for the positions of stage s's chain groups that run
        batched: needed by every member, and reading only batched earlier positions."""
        eqns, at = self.views[s].jaxpr.eqns, {}
        for group in self.groups[s]:
            batched = set()
            for k in range(len(group.chains[0])):
                members = [c[k] for c in group.chains]
                locals_ok = all(kind[0] != "local" or kind[1] in batched
                                for kind in (_input_kind(group, k, j, eqns)
                                             for j, v in enumerate(eqns[members[0]].invars)
                                             if not isinstance(v, Literal)))
                if all(i in need for i in members) and locals_ok:
                    batched.add(k)
                    at.update((i, (group, k)) for i in members)
        return at

    def _evaluate(self, s: int, inputs, exchanged: dict, upto: int, partial: bool):
        view, whole = self.views[s], self.whole.jaxpr
        env = dict(zip(view.jaxpr.constvars, view.consts))
        env.update(zip(view.jaxpr.invars, inputs))
        made = {v: i for i, e in enumerate(view.jaxpr.eqns) for v in e.outvars}
        targets = ([i for i in self.exchange if self.round_of[i] == upto + 1] if partial else
                   [made[v] for v in view.jaxpr.outvars
                    if not isinstance(v, Literal) and v in made])
        need = self._needed(s, targets)
        at, done = self._batched_positions(s, need), {}
        parts = []
        for i, (ev, ew) in enumerate(zip(view.jaxpr.eqns, whole.eqns)):
            if i not in need:
                continue
            if i in at:  # the same work for several leaves: once, on their concatenation
                group, k = at[i]
                if (id(group), k) not in done:
                    run_position(group, k, view.jaxpr.eqns, self._literal, env, done)
                continue
            this_round = partial and i in targets
            if i in self.exchange and not this_round:
                env[ev.outvars[0]] = exchanged[i]
                continue
            if all(math.prod(v.aval.shape) == 0 for v in ev.outvars):  # another stage's leaf
                env.update((v, _Empty(v.aval)) for v in ev.outvars)
                continue
            invals = [w.val if isinstance(w, Literal) else env[x]
                      for x, w in zip(ev.invars, ew.invars)]
            outs = _of_empties(ev, invals)
            if outs is None:
                outs = bind_equation(ev, [_materialise(x) for x in invals])
            if this_round:  # its local part, to be exchanged
                parts.append(outs[0])
                continue
            env.update(zip(ev.outvars, outs))
        return parts if partial else [env[x] if not isinstance(x, Literal) else x.val
                                      for x in view.jaxpr.outvars]

    def apply(self, stage, own, rep, gown, grep, state) -> tuple:
        """Traced on one device (in a ``shard_map`` without vma checks: the equations are bound
        one by one): the new (own, rep, state) buffers of stage ``stage`` (a traced index) from
        its parameter, gradient and state buffers."""
        leaves, n = self.leaves, len(self.leaves.avals)

        def inputs(s, own, rep, gown, grep, state):  # another stage's part is never materialised
            g = leaves.views(s, gown, grep, _Empty)
            st = self.state_layouts[s].unpack(state, _Empty)
            p = leaves.views(s, own, rep, _Empty)
            return g + st + p

        buffers = (own, rep, gown, grep, state)
        exchanged: dict = {}
        for r in range(self.rounds):
            ids = [i for i in self.exchange if self.round_of[i] == r + 1]

            def part(s, bufs, done, r=r):
                return self._evaluate(s, inputs(s, *bufs), done, r, True)
            vals = stage_switch(stage, [lambda b, d, s=s: part(s, b, d)
                                        for s in range(self.stages)], buffers, exchanged)
            for i, x in zip(ids, vals):
                exchanged[i] = self.exchange[i](x, "pipe")

        def final(s, bufs, done):
            outs = self._evaluate(s, inputs(s, *bufs), done, self.rounds, False)
            new_own, new_rep = leaves.pack_views(s, outs[:n])
            return new_own, new_rep, self.state_layouts[s].pack(outs[n:])
        return stage_switch(stage, [lambda b, d, s=s: final(s, b, d) for s in range(self.stages)],
                            buffers, exchanged)
