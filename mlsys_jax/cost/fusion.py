"""Which ops run as one kernel: the fusion models of the roofline cost model (lecture §4.2, §8.1).

Three groupings of the op view into kernels:

- ``none``: one kernel per op (eager execution; the lecture's unfused tables).
- ``adjacent``: the lecture's fusion model — maximal runs of adjacent non-contraction ops
  (elementwise, broadcasts, reductions, data movement, and named ops made only of those, like
  ``softmax_xent``) in program order; matmuls and convolutions stay kernels of their own.
- ``loop``: XLA:CPU's loop fusion — a non-contraction op joins the loop of the non-contraction
  ops that produce its inputs, following the data rather than the program order, unless the
  merged loop would both feed and consume another kernel (a cycle). For the §4.2 block this is
  what XLA:CPU emits: two convolutions and one loop doing BN, BN, add and relu.

A named call (``jit``, ``custom_jvp_call``, ...) is one op of the op view. The cost model keeps it
one kernel only when its body is one kernel under the hardware's fusion model — a contraction
may carry its elementwise epilogue where the hardware's libraries fuse one (cuDNN's conv+bias on
a GPU: the lecture's ``conv_bias`` is one kernel) — and otherwise costs the body: a jitted
model costs what the model costs.
"""
from __future__ import annotations

from mlsys_jax.ir.opview import Op, consumers, op_view
from mlsys_jax.ir.primitives import (CALLS, CONTRACTIONS, ELEMENTWISE, FREE, MOVEMENT,
                                     REDUCTIONS, RNG_BITS, SHAPE_ONLY)

KINDS = ("none", "adjacent", "loop")
LABELS = {"none": "one kernel per op", "adjacent": "fused (runs of adjacent elementwise ops)",
          "loop": "fused (elementwise loops beside each conv/matmul, as XLA:CPU)"}
# What a fused loop may contain: no contraction, nothing opaque; RNG bit generation is elementwise
# integer arithmetic (threefry), fused like any other.
FUSIBLE = ELEMENTWISE | SHAPE_ONLY | REDUCTIONS | MOVEMENT | RNG_BITS | (CALLS - {"remat2",
                                                                                 "shard_map"})


def is_fusible(op: Op) -> bool:
    """Non-contraction work that a fusion model merges with its neighbours."""
    prims = op.primitives
    return not (set(prims) & CONTRACTIONS) and all(p in FUSIBLE for p in prims)


def is_free(op: Op) -> bool:
    """Identity-like or host-side: no kernel at all."""
    return all(p in FREE for p in op.primitives)


def group(ops: list[Op], kind: str) -> list[list[Op]]:
    """Ops (in program order) grouped into kernels under fusion model ``kind``."""
    if kind == "none":
        return [[op] for op in ops]
    if kind == "adjacent":
        groups: list[list[Op]] = []
        for op in ops:
            if groups and is_fusible(op) and is_fusible(groups[-1][-1]):
                groups[-1].append(op)
            else:
                groups.append([op])
        return groups
    if kind == "loop":
        return _loops(ops)
    raise ValueError(f"unknown fusion model {kind!r}; one of {', '.join(KINDS)}")


def _loops(ops: list[Op]) -> list[list[Op]]:
    """XLA-style producer–consumer fusion: each fusible op joins every loop of its fusible
    producers that it can join without a cycle. Ancestor sets are bitmasks of op indices."""
    producer = {v: i for i, op in enumerate(ops) for e in op.eqns for v in e.outvars}
    ancestors: list[int] = []        # op index -> bitmask of every op it depends on
    group_of: list[int] = []         # op index -> id of its group
    members: dict[int, list] = {}    # group id -> its op indices
    mask: dict[int, int] = {}        # group id -> the same as a bitmask
    feeders: dict[int, set] = {}     # group id -> ops outside the group that feed it
    for i, op in enumerate(ops):
        feeds = {producer[v] for v in op.invars if v in producer}
        ancestors.append(0)
        for p in feeds:
            ancestors[i] |= (1 << p) | ancestors[p]
        group_of.append(i)
        members[i], mask[i], feeders[i] = [i], 1 << i, feeds
        if not is_fusible(op):
            continue
        for g in dict.fromkeys(group_of[p] for p in sorted(feeds) if is_fusible(ops[p])):
            here = group_of[i]
            merged = mask[g] | mask[here]
            outside = {p for p in feeders[g] | feeders[here] if not merged >> p & 1}
            if any(ancestors[p] & merged for p in outside):
                continue  # the merged loop would feed a kernel that feeds it back
            for j in members[here]:
                group_of[j] = g
            members[g] += members.pop(here)
            mask[g], feeders[g] = merged, outside
            del mask[here], feeders[here]
    # a loop runs once its last op's inputs are ready: order kernels by their last op
    return [[ops[j] for j in sorted(m)] for m in sorted(members.values(), key=max)]


def call_is_one_kernel(eqn, kind: str, epilogue: bool) -> bool:
    """Whether a named call runs as one kernel: its body (with its own calls judged the same
    way) groups into one kernel under fusion model ``kind`` (``none`` judges by ``adjacent``,
    the lecture's), or, with ``epilogue``, into a contraction and one loop fed by it."""
    from mlsys_jax.ir.opview import open_calls
    from mlsys_jax.ir.walk import bodies

    kind = "adjacent" if kind == "none" else kind
    body = bodies(eqn)[0].jaxpr
    view = open_calls(body, lambda e: not call_is_one_kernel(e, kind, epilogue))
    ops = [op for op in op_view(view) if not is_free(op)]
    groups = group(ops, kind)
    if len(groups) <= 1:
        return True
    if not (epilogue and len(groups) == 2 and len(groups[0]) == 1):
        return False
    head, tail = groups[0][0], groups[1]
    users = consumers(view)
    tail_eqns = {id(e) for op in tail for e in op.eqns}
    fed = all(u >= 0 and id(view.eqns[u]) in tail_eqns
              for v in head.outvars for u in users.get(v, []))
    return not is_fusible(head) and fed and all(is_fusible(op) for op in tail)
