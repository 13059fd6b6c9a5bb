"""Where a ``dot_general``'s operand dimensions go: its output is the batch dimensions, then the
left operand's free (neither contracted nor batched) dimensions, then the right's."""
from __future__ import annotations


def free_dims(eqn) -> list:
    """``[left, right]``: each operand's dimensions that are neither contracted nor batched."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    contract, batch = (lc, rc), (lb, rb)
    return [[d for d in range(len(v.aval.shape)) if d not in contract[i] and d not in batch[i]]
            for i, v in enumerate(eqn.invars[:2])]


def out_dim(eqn, side: int, d: int) -> int:
    """The output dimension that operand ``side``'s (uncontracted) dimension ``d`` becomes."""
    (_, _), (lb, rb) = eqn.params["dimension_numbers"]
    batch = (lb, rb)[side]
    if d in batch:
        return batch.index(d)
    free = free_dims(eqn)
    return len(lb) + (0 if side == 0 else len(free[0])) + free[side].index(d)
