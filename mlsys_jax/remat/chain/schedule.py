"""Recomputation schedules for an N-layer chain, as plain data (lecture §7.2).

A chain has activations h_0 (the input) … h_N; layer i computes h_i = layer_i(h_{i-1}). The
backward of layer i needs h_{i-1} and h_i in memory (the tanh VJP uses its output, §3.2). A
:class:`Schedule` is a program over three actions:

* ``("fwd", i)``  compute h_i from the live h_{i-1} (one layer forward);
* ``("free", i)`` drop h_i;
* ``("bwd", i)``  backward of layer i (needs h_{i-1} and h_i live; called for i = N … 1 in order).

"Stored activations" is the peak number of live h's (the lecture's memory figure, h_0 included);
"layer forwards" counts every ``fwd``. :meth:`Schedule.counts` is the dry run of the program; the
executors (``reference.run_reference``, ``jax_exec``) measure the same figures on real arrays.

``jax_plan`` is how the JAX executor applies the schedule with ``jax.checkpoint``: a tuple of parts,
each an int (that many layers, residuals kept) or ``("remat", subplan)`` (a segment whose
residuals are dropped and recomputed in the backward pass, JAX's convention).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mlsys_jax.errors import MlsysError

Action = tuple[str, int]


@dataclass(frozen=True)
class Counts:
    """What a schedule costs in the lecture's convention (§7.2)."""

    peak_activations: int   # most h's live at once, input included
    layer_forwards: int     # every layer forward, the first sweep included
    checkpoints: int        # h's kept by the first forward sweep (segment starts, h_0 included)

    def extra_forwards(self, n: int) -> int:
        """Forwards beyond the plain N of a store-all run (the recomputation's price)."""
        return self.layer_forwards - n


@dataclass(frozen=True)
class Schedule:
    """Which activations of an n-layer chain are kept, and how the rest are recomputed."""

    name: str
    n: int
    actions: tuple[Action, ...]
    jax_plan: tuple

    def counts(self) -> Counts:
        """Dry run of the action program: peak live activations, layer forwards, checkpoints."""
        live, peak, fwd, first_bwd = {0}, 1, 0, None
        for k, (op, i) in enumerate(self.actions):
            if op == "fwd":
                live.add(i)
                fwd += 1
            elif op == "free":
                live.discard(i)
            elif op == "bwd" and first_bwd is None:
                first_bwd = k
            peak = max(peak, len(live))
        sweep = self.actions[:first_bwd]
        kept = {0} | {i for op, i in sweep if op == "fwd"}
        kept -= {i for op, i in sweep if op == "free"}
        return Counts(peak, fwd, len(kept - {self.n}))

    def peak_units(self, sizes) -> int:
        """Peak memory of the program when h_i occupies ``sizes[i]`` units (h_0 included)."""
        live, peak = {0}, sizes[0]
        for op, i in self.actions:
            if op == "fwd":
                live.add(i)
            elif op == "free":
                live.discard(i)
            peak = max(peak, sum(sizes[j] for j in live))
        return peak

    def __str__(self) -> str:
        c = self.counts()
        return (f"Schedule {self.name} (N={self.n}): {c.peak_activations} stored activations (peak), "
                f"{c.layer_forwards} layer forwards ({c.extra_forwards(self.n)} extra), "
                f"{c.checkpoints} checkpoints")


def _check_n(api: str, n) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise MlsysError(f"{api}: n (number of layers) must be a positive int, got {n!r}")
    return n


def segments_schedule(name: str, n: int, starts: list[int], jax_plan: tuple) -> Schedule:
    """Keep h at each segment start in one forward sweep; per segment, recompute its interior.

    §7.2's convention: a segment [s, e) recomputes its e-s-1 interior activations from the stored
    h_s, since h_e is already stored (the next segment's start, or the output h_N).
    """
    bounds = sorted(set(starts) | {0}) + [n]
    keep = set(bounds)
    acts: list[Action] = []
    for i in range(1, n + 1):                      # forward sweep: keep segment starts only
        acts.append(("fwd", i))
        if i - 1 not in keep:
            acts.append(("free", i - 1))
    for s, e in reversed(list(zip(bounds[:-1], bounds[1:]))):
        acts += [("fwd", i) for i in range(s + 1, e)]   # recompute the interior
        for i in range(e, s, -1):                        # backward, freeing each h once used
            acts += [("bwd", i), ("free", i)]
    return Schedule(name, n, tuple(acts), jax_plan)


def store_all(n: int) -> Schedule:
    """Keep every activation: N+1 stored, N forwards."""
    n = _check_n("store_all", n)
    return segments_schedule("store-all", n, list(range(n)), (n,))


def every_k(n: int, k: int) -> Schedule:
    """A checkpoint every k layers: peak N/K + K, (K-1)·N/K extra forwards when K divides N.

    >>> print(every_k(16, 4))
    Schedule every-4 (N=16): 8 stored activations (peak), 28 layer forwards (12 extra), 4 checkpoints
    """
    n = _check_n("every_k", n)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
        raise MlsysError(f"every_k: k must be an int with 1 <= k <= n={n} (a segment length), "
                         f"got k={k!r}; use k=1 to store all or k=n for one segment")
    q, r = divmod(n, k)
    plan = (("remat", (k,)),) * q + ((("remat", (r,)),) if r else ())
    if k == 1:
        plan = (n,)          # a 1-layer segment has both ends stored: nothing to recompute
    return segments_schedule(f"every-{k}", n, list(range(0, n, k)), plan)


def sqrt_n(n: int) -> Schedule:
    """every_k with K = round(√N), the §7.2 optimum of N/K + K."""
    n = _check_n("sqrt_n", n)
    s = every_k(n, max(1, round(math.sqrt(n))))
    return Schedule(f"sqrt-n (K={round(math.sqrt(n))})", n, s.actions, s.jax_plan)


def input_only(n: int) -> Schedule:
    """Keep only the input; every layer's backward recomputes h_{i-1} and h_i from h_0.

    §7.2: 3 activations, N + N(N+1)/2 layer forwards. In JAX: layer_N ∘ remat(layer_{N-1} ∘
    remat(…)), which recomputes the prefix once per layer.
    """
    n = _check_n("input_only", n)
    acts: list[Action] = []
    for i in range(1, n + 1):                  # the forward sweep (the loss)
        acts.append(("fwd", i))
        if i > 1:
            acts.append(("free", i - 1))
    acts.append(("free", n))
    for i in range(n, 0, -1):
        for j in range(1, i + 1):              # recompute h_1..h_i from the input
            acts.append(("fwd", j))
            if j > 1 and j - 1 < i - 1:
                acts.append(("free", j - 1))
        acts += [("bwd", i), ("free", i)]
        if i > 1:
            acts.append(("free", i - 1))
    plan: tuple = (1,)
    for _ in range(n - 1):
        plan = (("remat", plan), 1)
    return Schedule("input-only", n, tuple(acts), plan)


def plan_length(plan: tuple) -> int:
    """Number of layers a jax_plan covers."""
    return sum(p if isinstance(p, int) else plan_length(p[1]) for p in plan)
