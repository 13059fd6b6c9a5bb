"""The guard tree replayed as one program (lecture §8.1: TF's Switch/Merge, the graph way).

A warm call that walks the guard tree runs one compiled segment per graph and reads every guard
on the host between them (a blocking device→host copy). Once the outcomes along a path are known,
the whole tree below a break is one program instead: each segment's recorded primitives, and at
each break a ``lax.switch`` over the known outcomes — a ``bool`` guard by its predicate, a scalar
guard (``int``, ``float``, ``item``) by the bit pattern of its value (``break_guards.py``). A warm call
dispatches it once, with no guard read on the host.

If some outcome has not been seen yet (a ``bool`` break with one known branch, any scalar guard),
the program has a *miss* branch and returns a flag first: the caller reads that one flag and, on a
miss, runs the Python (a cold call). A tree whose every ``bool`` break has both outcomes has no
flag and returns as soon as it is dispatched.

Same primitives, compiled as the segments are (``exact_programs.py``), so results stay bitwise equal
to eager. A tree is one program only if every path returns the same structure
with the same types (weak types included: ``lax.switch`` would otherwise promote them) and the
same Python constants, and, in exact mode, every segment is one program with no unit.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import jax
import jax.numpy as jnp

from mlsys_jax.compat import zeros_of
from mlsys_jax.execute.capture.exact_programs import bakeable, baked, bind_eqns, const_key, options
from mlsys_jax.execute.capture.break_guards import checkable_on_device, device_index, device_predicate


@dataclass(frozen=True)
class TreeProgram:
    """One program for a subtree: ``fn(*consts, *env[in_slots])`` -> ([miss flag], *leaves).

    ``bare``: the function returns one array, which the program returns as it is (no tuple).
    """

    fn: Callable
    in_slots: tuple
    consts: tuple
    flagged: bool
    out_tree: Any
    specs: tuple  # the return's leaves: ('slot', s) from the program, ('const', v) from Python
    bare: bool = False

    def call(self, env):
        """Run on the values of ``in_slots`` (``env[s]``): the result, or MISS (unseen outcome)."""
        res = self.fn(*self.consts, *[env[s] for s in self.in_slots])
        if self.bare:
            return res
        if self.flagged:
            if res[0]:  # one device→host read: the miss flag
                return MISS
            res = res[1:]
        if len(res) == len(self.specs):
            return jax.tree_util.tree_unflatten(self.out_tree, res)
        it = iter(res)
        return jax.tree_util.tree_unflatten(self.out_tree, [
            next(it) if k == "slot" else v.copy() if k == "copy" else v for k, v in self.specs])

    def direct(self, n_inputs: int) -> Callable | None:
        """The program as a function of the call's ``n_inputs`` arrays, in order, returning the
        result — a warm call's hot path (no env, no flag to read) — or None where it needs
        more: a miss flag, inputs it does not read, Python constants in the result."""
        if self.flagged or self.in_slots != tuple(range(n_inputs)):
            return None
        fn = partial(self.fn, *self.consts) if self.consts else self.fn
        if self.bare:
            return fn
        if any(k != "slot" for k, _ in self.specs):
            return None
        tree = self.out_tree
        return lambda *inputs: jax.tree_util.tree_unflatten(tree, fn(*inputs))


MISS = object()


@dataclass
class _Plan:
    positions: dict = field(default_factory=dict)  # id(segment) -> its consts' positions
    consts: list = field(default_factory=list)  # each value once (fewer program arguments)
    const_index: dict = field(default_factory=dict)
    finals: dict = field(default_factory=dict)  # signature -> a final
    flagged: bool = False

    def add_const(self, c) -> int:
        key = (_const_sig(c), str(c.dtype), c.weak_type)
        if key not in self.const_index:
            self.const_index[key] = len(self.consts)
            self.consts.append(c)
        return self.const_index[key]


def _const_sig(v):
    try:
        return ("c", const_key(v))
    except (TypeError, ValueError):
        return ("py", id(v))


def _signature(final):
    out_tree, specs, avals = final
    return out_tree, tuple(("slot", a) if k == "slot" else _const_sig(v)
                           for (k, v), a in zip(specs, avals))


def _complete(node) -> bool:
    return node.final is not None or node.kind is not None


def _analyze(node, plan: _Plan, exact: bool) -> bool:
    """Whether the subtree can be one program; fills the plan (consts, finals, miss flag)."""
    if not _complete(node):  # a call that raised here: a miss, like an unseen outcome
        plan.flagged = True
        return True
    seg = node.seg
    if seg is not None:
        if exact and not seg.one_program():
            return False
        if id(seg) not in plan.positions:
            plan.positions[id(seg)] = [plan.add_const(c) for c in seg.consts]
    if node.final is not None:
        plan.finals.setdefault(_signature(node.final), node.final)
        return len(plan.finals) == 1
    if not node.children or not checkable_on_device(node.kind, node.aval):
        return False
    if node.kind == "bool":
        plan.flagged |= len(node.children) < 2
    elif node.raws is None:  # more bit patterns than the program checks
        return False
    else:
        plan.flagged = True  # a scalar guard can always take a new value
    return all(_analyze(c, plan, exact) for c in node.children.values())


def _needs(node) -> set:
    """Slots the subtree reads that it does not compute."""
    seg = node.seg
    made, reads = (set(seg.out_slots), set(seg.in_slots)) if seg is not None else (set(), set())
    if node.final is not None:
        later = {s for k, s in node.final[1] if k == "slot"}
    elif node.kind is not None:
        later = {node.slot}.union(*(_needs(c) for c in node.children.values()))
    else:
        later = set()
    return reads | (later - made)


def build(node, exact: bool) -> TreeProgram | None:
    """The one-program replay of the subtree at a break ``node``, or None if it cannot be one."""
    plan = _Plan()
    if node.final is not None or not _analyze(node, plan, exact) or len(plan.finals) != 1:
        return None
    (final,) = plan.finals.values()
    out_tree, specs, avals = final
    if any(k == "leaf" for k, _ in specs):  # returns an argument as it is: the walk does that
        return None
    slot_avals = [a for (k, _), a in zip(specs, avals) if k == "slot"]
    if plan.flagged and any(jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended)
                            for a in slot_avals):
        return None
    in_slots = tuple(sorted(_needs(node)))
    flagged = plan.flagged

    def miss(env):
        del env
        return jnp.asarray(True), [zeros_of(a) for a in slot_avals]

    def visit(n, env, consts):
        if not _complete(n):
            return miss(env)
        env = dict(env)
        if n.seg is not None:
            bind_eqns(n.seg.eqns, env, [consts[p] for p in plan.positions[id(n.seg)]], exact)
        if n.final is not None:
            return jnp.asarray(False), [env[s] for k, s in n.final[1] if k == "slot"]
        def branch(child):
            return miss if child is None else lambda e: visit(child, e, consts)

        if n.kind == "bool":  # a lax.cond on the predicate itself: nothing computed to choose
            known = {key[1][1]: child for key, child in n.children.items()}
            return jax.lax.cond(device_predicate(env[n.slot]), branch(known.get(True)),
                                branch(known.get(False)), env)
        index = {key: i for i, key in enumerate(n.children)}
        table = [(raw, index[key]) for raw, key in n.raws.items()]
        branches = [branch(child) for child in n.children.values()] + [miss]
        return jax.lax.switch(device_index(env[n.slot], table, len(index)), branches, env)

    bare = not flagged and len(specs) == 1 and specs[0][0] == "slot" \
        and out_tree == jax.tree_util.tree_structure(0)

    # Small constants are baked into the program (each argument adds to the call's cost), behind
    # barriers so that no rewrite sees their values (exact_programs.baked); larger ones are arguments.
    params = tuple(c for c in plan.consts if not bakeable(c))

    n_params = len(params)

    def program(*args):  # (*params, *inputs): params first, so a partial can bind them
        it = iter(args[:n_params])
        consts = [baked(c) if bakeable(c) else next(it) for c in plan.consts]
        flag, leaves = visit(node, dict(zip(in_slots, args[n_params:])), consts)
        return leaves[0] if bare else ((flag,) if flagged else ()) + tuple(leaves)

    fn = jax.jit(program, compiler_options=options(exact))
    return TreeProgram(fn, in_slots, params, flagged, out_tree, specs, bare)
