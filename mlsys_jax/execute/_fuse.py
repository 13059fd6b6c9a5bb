"""Warm replay of a whole two-way branch as one program (lecture §8.1: TF's Switch/Merge).

Once a capture has seen *both* outcomes of a ``bool`` graph break, and each outcome's path runs
one segment and returns, the break node, its segment and both children are one ``lax.cond``
program: a warm call dispatches it once, with no device→host read of the guard. This is the
same assumption as segment replay (the function is pure) and the same primitives, compiled as
the segments are (``exact`` keeps XLA's fusion off), so results stay bitwise equal to eager.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax

from mlsys_jax.execute._record import EXACT_OPTIONS, replay

TRUE, FALSE = ("bool", True), ("bool", False)


@dataclass(frozen=True)
class FusedBranch:
    """One program for a break node and both its children: reads ``in_slots``, returns leaves."""

    fn: Callable
    in_slots: tuple
    out_tree: object


def _final_child(node):
    return node is not None and node.kind is None and node.final is not None \
        and all(kind == "slot" for kind, _ in node.final[1])


def fusable(node) -> bool:
    """A bool break whose two outcomes are known, each one segment and a return of the same tree."""
    if node.kind != "bool" or node.extra or set(node.children) != {TRUE, FALSE}:
        return False
    t, f = node.children[TRUE], node.children[FALSE]
    return _final_child(t) and _final_child(f) and t.final[0] == f.final[0]


def _run(seg, env: dict) -> dict:
    """Bind a segment's recorded primitives inside the fused program (its own jit is top-level
    only: compiled with ``exact`` options, it cannot be nested)."""
    if seg is not None:
        env = dict(env)
        body = replay(seg.eqns, seg.consts, seg.in_slots, seg.out_slots)
        env.update(zip(seg.out_slots, body(*[env[s] for s in seg.in_slots])))
    return env


def fuse_branch(node, exact: bool) -> FusedBranch | None:
    """Build (and compile lazily) the one-program replay of ``node``; None if it cannot be one."""
    seg = node.seg
    made = set(seg.out_slots) if seg is not None else set()
    needed = set(seg.in_slots) if seg is not None else set()
    for child in node.children.values():
        child_made = set(child.seg.out_slots) if child.seg is not None else set()
        child_in = set(child.seg.in_slots) if child.seg is not None else set()
        needed |= (child_in | ({s for _, s in child.final[1]} - child_made)) - made
    if node.slot not in made:
        needed.add(node.slot)
    in_slots = tuple(sorted(needed))
    true_child, false_child = node.children[TRUE], node.children[FALSE]

    def branch(child):
        def run_child(env):
            out = _run(child.seg, env)
            return tuple(out[s] for _, s in child.final[1])
        return run_child

    def program(*vals):
        env = _run(seg, dict(zip(in_slots, vals)))
        pred = env[node.slot]
        if getattr(pred, "shape", None) != ():
            raise TypeError("a fused branch needs a scalar guard")
        return jax.lax.cond(pred.astype(bool), branch(true_child), branch(false_child), env)

    fn = jax.jit(program, compiler_options=EXACT_OPTIONS if exact else None)
    return FusedBranch(fn, in_slots, true_child.final[0])
