"""ZeRO's stages as data: what each one shards over the data axis, and what that leaves per device.

Rajbhandari et al. (2020), lecture §7.3. Plain data parallelism keeps a whole copy of the
parameters, their gradients and the optimizer state on every device; stage k shards the first k
of optimizer state, gradients and parameters over the N devices of the data axis. The lecture's
``shard_map`` step (``lecture/zero.py``), the layout of a user's step (``shard/layout.py``), its
collectives' formulas (``shard/collectives.py``) and the CLI's ``--zero`` choices all read this
one table, so a stage means the same thing everywhere and a new one is a row here.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ZeroStage:
    """One ZeRO stage: which of the training state's three parts it splits over the data axis."""

    number: int
    optimizer: bool     # optimizer state (Adam's m and v) split over data
    grads: bool         # gradients split (reduce-scattered instead of all-reduced)
    params: bool        # parameters split (all-gathered for the forward and backward)
    what: str


STAGES = (
    ZeroStage(0, optimizer=False, grads=False, params=False,
              what="plain data parallel: every device holds everything"),
    ZeroStage(1, optimizer=True, grads=False, params=False,
              what="optimizer state split over data"),
    ZeroStage(2, optimizer=True, grads=True, params=False,
              what="optimizer state and gradients split over data"),
    ZeroStage(3, optimizer=True, grads=True, params=True,
              what="optimizer state, gradients and parameters split over data"),
)
STAGE_NUMBERS = tuple(s.number for s in STAGES)
_BY_NUMBER = {s.number: s for s in STAGES}


def zero_stage(number: int) -> ZeroStage:
    """The table's row for stage ``number``; callers check ``number in STAGE_NUMBERS`` first and
    word their own error (a CLI flag, an API argument)."""
    return _BY_NUMBER[number]


def per_device_bytes(stage: int, params, grads, optimizer, n: int,
                     optimizer_whole=0) -> dict:
    """Bytes one of ``n`` data devices holds of each part, given that part's unsharded bytes.

    What ``stage`` shards is divided by ``n``; ``optimizer_whole`` is optimizer state that
    mirrors no parameter (Adam's step count) and stays whole at every stage. A share is an
    integer when ``n`` divides the bytes (the lecture pads its flat vector so it does), else a
    fraction of a byte: a model of the memory, not of a layout's rounding.
    """
    row = zero_stage(stage)
    share = lambda b, split: _divide(b, n) if split else b
    return {"params": share(params, row.params), "grads": share(grads, row.grads),
            "optimizer": share(optimizer, row.optimizer) + optimizer_whole}


def _divide(b, n: int):
    return b // n if b % n == 0 else b / n
