"""When to stop timing: a sequential test on paired rounds (``Programs.time`` asks after each).

A timing session of ``remat`` exists to decide two things: which fitting plan is the answer, and
how each timed built-in policy stands against the fastest plan within its temp bytes. Both are
read from paired per-round ratios (``timing.ratio``), so once each is settled more rounds cannot
change the report's verdict, only its decimals, and at GPT-2 size a round is seconds per program.

A contest between two programs is settled when either
- their rounds are within noise in the sense the report already uses, which more rounds cannot
  undo because min–max spreads only widen: for plans, their ratios to no remat overlap
  (``Frontier._within_noise`` then takes the fewest FLOPs); for a policy, the plan / policy
  ratio's rounds straddle 1 (``policies.verdict``: as fast within the noise); or
- the 95% t-interval of the mean log paired ratio excludes 0 (one is faster, not by chance).

``decide`` returns the reason to stop, or None to run another round.
"""
from __future__ import annotations

import math
import statistics

from mlsys_jax import timing

# two-sided 95% Student t quantiles by degrees of freedom; beyond the table 2.23 (≥ the quantile)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
MIN_ROUNDS = 3       # rounds before any contest may be settled
# With no contest the choice is made before any round: one round measures the step time shown.
UNCONTESTED_ROUNDS = 1


def interval(ratios: list[float]) -> tuple[float, float]:
    """The 95% t-interval of the geometric mean of paired ratios (needs two or more)."""
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    half = T975[min(n - 2, len(T975) - 1)] * statistics.stdev(logs) / math.sqrt(n)
    mean = statistics.fmean(logs)
    return math.exp(mean - half), math.exp(mean + half)


def _apart(ratios: list[float]) -> tuple[float, float] | None:
    """The t-interval when it excludes 1, else None (also with fewer than two rounds)."""
    if len(ratios) < 2:
        return None
    lo, hi = interval(ratios)
    return (lo, hi) if hi < 1 or lo > 1 else None


def contested(plans: dict, policies: dict) -> bool:
    """Whether a session of ``plans`` and ``policies`` (label -> temp bytes) has anything to
    settle: two plans, or a policy with a plan within its bytes."""
    return len(plans) > 1 or any(b <= nbytes for nbytes in policies.values()
                                 for b in plans.values())


def decide(times: dict, reference: str, plans: dict, policies: dict) -> str | None:
    """Why the session may stop now, or None. ``times``: label -> Timing so far (same rounds);
    ``plans`` and ``policies``: label -> compiled temp bytes of the timed candidates and
    policies."""
    if not plans:
        return "nothing to choose: no remat is the answer"
    ratio = {k: timing.ratio(times[k], times[reference]) for k in plans}
    said = []
    if len(plans) > 1:
        leader = min(plans, key=lambda k: ratio[k].median)
        for rival in (k for k in plans if k != leader):
            r, q = ratio[leader], ratio[rival]
            if q.low <= r.high and q.high >= r.low:
                said.append(f"{leader} and {rival} overlap (indistinguishable)")
                continue
            apart = _apart(timing.per_round(times[leader], times[rival]))
            if apart is None:
                return None
            said.append(f"{leader} faster than {rival} (×{apart[0]:.3g}–{apart[1]:.3g}, 95%)")
    for name, nbytes in policies.items():
        fits = [k for k in plans if plans[k] <= nbytes]
        if not fits:
            continue
        best = min(fits, key=lambda k: ratio[k].median)
        per_round = timing.per_round(times[best], times[name])
        if min(per_round) <= 1 <= max(per_round):
            said.append(f"{name} as fast as {best} within the noise")
            continue
        apart = _apart(per_round)
        if apart is None:
            return None
        said.append(f"{best} over {name} ×{apart[0]:.3g}–{apart[1]:.3g} (95%)")
    if not said:
        return "nothing to choose: one plan beside no remat"
    return "settled: " + "; ".join(said)
