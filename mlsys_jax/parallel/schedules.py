"""Pipeline schedules as data (lecture §5.3): a step × stage table of forward/backward actions.

A schedule is built by simulating its stages in lock step: each stage has a preferred order of
actions (GPipe: all forwards, then all backwards; 1F1B: a few warm-up forwards, then one forward
and one backward in turn) and runs its next action as soon as that action's inputs arrived in an
earlier step. Bubble fraction and peak in-flight microbatches are counted from the table, never
taken from the formula; :mod:`mlsys_jax.parallel.lecture.pipeline` executes the same table.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.errors import MlsysError


@dataclass(frozen=True)
class Action:
    """One cell of the table: forward ("F") or backward ("B") of microbatch ``mb`` (0-based)."""

    kind: str
    mb: int

    def __str__(self) -> str:  # the lecture numbers microbatches from 1: F1 … F4
        return f"{self.kind}{self.mb + 1}"


@dataclass(frozen=True)
class PipelineSchedule:
    """``table[step][stage]`` is an :class:`Action` or ``None`` (idle: a bubble slot)."""

    name: str
    stages: int
    microbatches: int
    table: tuple[tuple[Action | None, ...], ...]

    @property
    def steps(self) -> int:
        """Time steps in the table (its length), bubbles included."""
        return len(self.table)

    def bubble_fraction(self) -> Fraction:
        """Idle slots / all slots, exactly (forward and backward each take one step, §5.3)."""
        idle = sum(cell is None for row in self.table for cell in row)
        return Fraction(idle, self.steps * self.stages)

    def in_flight_peaks(self) -> tuple[int, ...]:
        """Per stage, the most microbatches forwarded but not yet backwarded at once.

        Each of them keeps its stashed activations alive, so this is the stage's activation memory
        in units of one microbatch (GPipe: M everywhere; 1F1B: P - stage).
        """
        peaks = []
        for s in range(self.stages):
            live = peak = 0
            for row in self.table:
                if row[s] is not None:
                    live += 1 if row[s].kind == "F" else -1
                    peak = max(peak, live)
            peaks.append(peak)
        return tuple(peaks)

    def timeline(self, label: str = "GPU") -> str:
        """The lecture's picture: one line per stage, ``GPU1 | F1 F2 F3 F4  .  . B4 B3 B2 B1``."""
        width = max(len(str(c)) for row in self.table for c in row if c is not None)
        lines = []
        for s in range(self.stages):
            cells = [("." if row[s] is None else str(row[s])).rjust(width) for row in self.table]
            lines.append(f"{label}{s + 1} | " + " ".join(cells))
        return "\n".join(lines)

    def check_dependencies(self) -> None:
        """Raise MlsysError unless every action runs once and after the actions it needs."""
        done: dict[tuple[str, int, int], int] = {}
        for t, row in enumerate(self.table):
            for s, a in enumerate(row):
                if a is None:
                    continue
                if (a.kind, s, a.mb) in done:
                    raise MlsysError(f"schedule {self.name}: {a} runs twice on stage {s + 1}")
                for need in _needs(a, s, self.stages):
                    if done.get(need, t) >= t:
                        raise MlsysError(f"schedule {self.name}: {a} on stage {s + 1} at step "
                                         f"{t + 1} runs before its input {need} is ready")
                done[(a.kind, s, a.mb)] = t
        if len(done) != 2 * self.stages * self.microbatches:
            raise MlsysError(f"schedule {self.name}: {len(done)} actions, expected "
                             f"{2 * self.stages * self.microbatches} (F and B per stage and mb)")


def _needs(a: Action, s: int, stages: int) -> list[tuple[str, int, int]]:
    """The actions whose results ``a`` on stage ``s`` consumes (sent one step earlier)."""
    if a.kind == "F":
        return [("F", s - 1, a.mb)] if s > 0 else []
    needs = [("F", s, a.mb)]
    return needs + ([("B", s + 1, a.mb)] if s < stages - 1 else [])


def validate_pipeline(stages: int, microbatches: int, layers: int | None = None,
                      api: str = "pipeline") -> None:
    """Clear errors for counts a pipeline cannot have (JAX would fail obscurely, or not at all)."""
    for name, v in (("stages", stages), ("microbatches", microbatches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise MlsysError(f"{api}: {name} must be an integer >= 1, got {v!r}; "
                             f"e.g. {name}=2")
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise MlsysError(f"{api}: layers must be an integer >= 1, got {layers!r}")
        if stages > layers:
            raise MlsysError(f"{api}: {stages} stages but only {layers} layers; every stage needs "
                             f"at least one layer, so use stages <= {layers} or a deeper model")


def _simulate(name: str, stages: int, microbatches: int,
              order: Callable[[int], Sequence[Action]]) -> PipelineSchedule:
    """Run each stage's ``order`` in lock step; an action waits until its inputs are ready."""
    queues = [list(order(s)) for s in range(stages)]
    done: dict[tuple[str, int, int], int] = {}
    table: list[tuple[Action | None, ...]] = []
    limit = 4 * (microbatches + stages) + 4  # both orders finish in 2(M+P-1) steps
    while any(queues):
        if len(table) > limit:
            raise MlsysError(f"schedule {name}: stages deadlocked (an order that can never run)")
        t, row = len(table), []
        for s, queue in enumerate(queues):
            ready = queue and all(done.get(n, t) < t for n in _needs(queue[0], s, stages))
            row.append(queue.pop(0) if ready else None)
        for s, a in enumerate(row):
            if a is not None:
                done[(a.kind, s, a.mb)] = t
        table.append(tuple(row))
    return PipelineSchedule(name, stages, microbatches, tuple(table))


def gpipe(stages: int, microbatches: int, layers: int | None = None) -> PipelineSchedule:
    """GPipe: every stage forwards all M microbatches, then backwards them (last first, §5.3).

    >>> g = gpipe(4, 8)
    >>> g.bubble_fraction(), bubble_formula(4, 8), g.in_flight_peaks()
    (Fraction(3, 11), Fraction(3, 11), (8, 8, 8, 8))
    >>> one_f_one_b(4, 8).in_flight_peaks()
    (4, 3, 2, 1)
    """
    validate_pipeline(stages, microbatches, layers, api="gpipe")
    f = [Action("F", i) for i in range(microbatches)]
    b = [Action("B", i) for i in reversed(range(microbatches))]
    return _simulate("gpipe", stages, microbatches, lambda s: f + b)


def one_f_one_b(stages: int, microbatches: int, layers: int | None = None) -> PipelineSchedule:
    """1F1B (PipeDream-flush): stage s warms up with P-s-1 forwards, then alternates F and B.

    Same bubble as GPipe, but a stage holds at most P-s microbatches in flight instead of M.
    """
    validate_pipeline(stages, microbatches, layers, api="one_f_one_b")

    def order(s: int) -> list[Action]:
        warm = min(stages - s - 1, microbatches)
        acts = [Action("F", i) for i in range(warm)]
        for i in range(warm, microbatches):
            acts += [Action("F", i), Action("B", i - warm)]
        return acts + [Action("B", i) for i in range(microbatches - warm, microbatches)]

    return _simulate("1f1b", stages, microbatches, order)


SCHEDULES: dict[str, Callable[..., PipelineSchedule]] = {"gpipe": gpipe, "1f1b": one_f_one_b}


def make_schedule(name: str, stages: int, microbatches: int,
                  layers: int | None = None) -> PipelineSchedule:
    """Build a schedule by name ('gpipe' or '1f1b')."""
    if name not in SCHEDULES:
        raise MlsysError(f"make_schedule: unknown schedule {name!r}; choose one of "
                         f"{', '.join(map(repr, SCHEDULES))}")
    return SCHEDULES[name](stages, microbatches, layers)


def bubble_formula(stages: int, microbatches: int) -> Fraction:
    """The lecture's (P-1)/(M+P-1), as an exact fraction (to compare with the table's count)."""
    validate_pipeline(stages, microbatches, api="bubble_formula")
    return Fraction(stages - 1, microbatches + stages - 1)


def min_microbatches(stages: int, max_bubble: float | Fraction, schedule: str = "gpipe",
                     limit: int = 1024) -> int:
    """Smallest M whose schedule table has a bubble below ``max_bubble`` (§12 exercise 6).

    Counted on built tables, M = 1, 2, ...; the bubble falls monotonically in M.
    """
    if not 0 < max_bubble <= 1:
        raise MlsysError(f"min_microbatches: max_bubble must be in (0, 1], got {max_bubble!r}")
    # Exact: the float 0.1 is slightly above 1/10, which would let M = 27 (bubble 3/30) pass.
    target = Fraction(str(max_bubble)) if isinstance(max_bubble, float) else Fraction(max_bubble)
    for m in range(1, limit + 1):
        if make_schedule(schedule, stages, m).bubble_fraction() < target:
            return m
    raise MlsysError(f"min_microbatches: no M <= {limit} gets the bubble of {stages} stages "
                     f"below {max_bubble}; raise limit= or accept a larger bubble")


# The action table as the executors read it (the lecture's and a user's pipeline alike): one
# int32 column per field, one row per step.
IDLE, FORWARD, BACKWARD, BACKWARD_LOSS = range(4)
COLUMNS = ("op", "mb", "slot", "recv_act", "recv_grad")


def action_arrays(schedule: PipelineSchedule) -> dict[str, np.ndarray]:
    """The table as int32 arrays of shape [steps, stages]: what to do, and where data lives.

    ``op``: IDLE/FORWARD/BACKWARD (BACKWARD_LOSS on the last stage, which starts from the loss);
    ``mb``: the microbatch; ``slot``: the buffer row holding its stage input and cotangent;
    ``recv_act``/``recv_grad``: 1 + the row where the activation from stage s-1 / cotangent from
    stage s+1 that arrives after this step is written, 0 when nothing arrives.

    Rows are allocated like registers: a microbatch takes a row on stage s when its activation
    arrives (stage 0: at its forward) and frees it after its backward there, so the buffers have
    as many rows as the schedule keeps microbatches at once — M for GPipe, about P for 1F1B.
    """
    steps, stages = schedule.steps, schedule.stages
    out = {k: np.zeros((steps, stages), np.int32) for k in COLUMNS}
    row_of: dict[tuple[int, int], int] = {}
    free: list[list[int]] = [[] for _ in range(stages)]
    used = [0] * stages

    def take(s: int, mb: int) -> int:
        if not free[s]:
            free[s].append(used[s])
            used[s] += 1
        row_of[(s, mb)] = free[s].pop(0)
        return row_of[(s, mb)]

    for t, row in enumerate(schedule.table):
        for s, a in enumerate(row):  # this step's actions read their rows first
            if a is None:
                continue
            out["mb"][t, s] = a.mb
            if a.kind == "F":
                out["op"][t, s] = FORWARD
                out["slot"][t, s] = take(s, a.mb) if s == 0 else row_of[(s, a.mb)]
            else:
                out["op"][t, s] = BACKWARD_LOSS if s == stages - 1 else BACKWARD
                out["slot"][t, s] = row_of[(s, a.mb)]
        for s, a in enumerate(row):  # then rows are freed, and arrivals written
            if a is None:
                continue
            if a.kind == "B":
                free[s].append(row_of[(s, a.mb)])
                if s > 0:
                    out["recv_grad"][t, s - 1] = row_of[(s - 1, a.mb)] + 1
            elif s + 1 < stages:
                out["recv_act"][t, s + 1] = take(s + 1, a.mb) + 1
    return out


def buffer_rows(columns: dict[str, np.ndarray]) -> int:
    """Rows the executor's stash and cotangent buffers need for these action arrays."""
    return int(max(columns["slot"].max(), columns["recv_act"].max() - 1)) + 1


def write_row(buf, index_plus_one, value):
    """``buf[index] = value`` when ``index_plus_one > 0``; unchanged otherwise."""
    i = jnp.maximum(index_plus_one - 1, 0)
    new = jnp.where(index_plus_one > 0, value, lax.dynamic_index_in_dim(buf, i, keepdims=False))
    return lax.dynamic_update_index_in_dim(buf, new, i, 0)
