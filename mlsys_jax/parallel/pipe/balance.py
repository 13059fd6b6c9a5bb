"""Which units go on which stage: balanced by the cost model, or at the user's split points.

Each unit's cost is the cost model's estimated time of its forward and backward for one
microbatch (``mlsys_jax.cost``, on the hardware asked for), measured as a stage of its own; the
balanced split is the contiguous partition into P stages whose slowest stage is fastest (a
dynamic programme over the units). The stages' own estimates are then taken again on the chosen
split (recomputed batch-only values and boundary bookkeeping make a stage a little more than the
sum of its units).
"""
from __future__ import annotations

import re

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.pipe.split import build_split
from mlsys_jax.parallel.pipe.stagefn import estimated_time_us
from mlsys_jax.parallel.pipe.units import Units


def unit_costs(closed, n_params: int, units: Units, hw) -> list[float]:
    """Estimated forward + backward µs of each unit, each as a stage of its own.

    The iterations of a stack cost the same: one of them is estimated for all.
    """
    split = build_split(closed, n_params, units, tuple(range(len(units.units))))
    costs, per_stack = [], {}
    for s, u in enumerate(units.units):
        if u.stack is not None and 0 < u.iteration < u.stack.length - 1 and u.stack in per_stack:
            costs.append(per_stack[u.stack])
            continue
        costs.append(estimated_time_us(split, s, hw))
        if u.stack is not None and 0 < u.iteration < u.stack.length - 1:
            per_stack[u.stack] = costs[-1]
    return costs


def balanced(costs, stages: int) -> tuple[int, ...]:
    """Stage of each unit: contiguous, ``stages`` non-empty runs, the largest sum smallest."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for p in range(1, stages + 1):
        for i in range(p, n + 1):
            for j in range(p - 1, i):
                v = max(best[p - 1][j], prefix[i] - prefix[j])
                if v < best[p][i]:
                    best[p][i], cut[p][i] = v, j
    bounds, i = [], n
    for p in range(stages, 0, -1):
        bounds.append((cut[p][i], i))
        i = cut[p][i]
    out = [0] * n
    for s, (lo, hi) in enumerate(reversed(bounds)):
        out[lo:hi] = [s] * (hi - lo)
    return tuple(out)


def ranges_of(stage_of_unit) -> list[tuple[int, int]]:
    """The ``(lo, hi)`` range of units of each stage."""
    out, lo = [], 0
    for k in range(1, len(stage_of_unit) + 1):
        if k == len(stage_of_unit) or stage_of_unit[k] != stage_of_unit[lo]:
            out.append((lo, k))
            lo = k
    return out


def _normal(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def at_split_points(units: Units, names, stages: int) -> tuple[int, ...]:
    """Stage of each unit when a new stage starts at each named unit (``--split a,b``)."""
    names = [n.strip() for n in names if n.strip()]
    have = [u.name for u in units.units]
    if len(names) + 1 != stages:
        raise MlsysError(f"--split names {len(names)} split point(s), which make "
                         f"{len(names) + 1} stages, but the mesh has pipe={stages}; give "
                         f"{stages - 1} split point(s) or use --mesh pipe={len(names) + 1}")
    starts = []
    for n in names:
        hits = [k for k, h in enumerate(have) if h == n] or \
            [k for k, h in enumerate(have) if _normal(h) == _normal(n)]
        if len(hits) != 1:
            what = "matches no unit" if not hits else f"matches {len(hits)} units"
            raise MlsysError(f"--split {n!r} {what}; the units are {', '.join(have)}")
        if hits[0] == 0:
            raise MlsysError(f"--split {n!r} is the first unit; a split point starts a later "
                             f"stage, e.g. --split {have[len(have) // 2]}")
        starts.append(hits[0])
    if starts != sorted(set(starts)):
        raise MlsysError(f"--split points must name distinct units in model order; got "
                         f"{', '.join(names)} (order: {', '.join(have)})")
    out, s = [], 0
    for k in range(len(have)):
        if s < len(starts) and k == starts[s]:
            s += 1
        out.append(s)
    return tuple(out)


def check_stage_count(units: Units, stages: int) -> None:
    """Refuse more pipeline stages than units to cut between, naming the units."""
    if len(units.units) < stages:
        raise MlsysError(f"pipe={stages} needs at least {stages} units to cut between, but the "
                         f"model has {len(units.units)} ({', '.join(u.name for u in units.units)}"
                         f", found from {units.source}); use --mesh pipe=P with P <= "
                         f"{len(units.units)}, or mark more split points with jax.named_scope")
