"""Estimate, then confirm: graphs compiled with ``jax.jit`` and timed side by side on this machine.

The roofline model predicts; this measures the same jaxprs as XLA compiles them here, in
interleaved rounds (:func:`mlsys_jax.timing.compare`), so a predicted speedup can sit beside a
measured one (``optimize --measure``, experiment 02's CPU table, ``bench passes``), and the search
can pick the graph that runs fastest where it runs (:func:`fastest`): TASO measures its operators
on the device, because a cost model alone can be wrong about a machine (XLA:CPU fuses BatchNorm
into the conv's consumer loop, so folding it saves nothing there, lecture §4.2).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from mlsys_jax import timing


@dataclass(frozen=True)
class Speedup:
    """Measured time of an original and an optimized graph, and the paired ratio of the two."""

    original: timing.Timing
    optimized: timing.Timing
    ratio: timing.Ratio  # original / optimized: > 1 means faster

    def to_dict(self) -> dict:
        """Both medians, the speedup with its spread and the rounds timed, as plain data for JSON."""
        return {"original_us": self.original.median_us, "optimized_us": self.optimized.median_us,
                "speedup": self.ratio.median, "speedup_min": self.ratio.low,
                "speedup_max": self.ratio.high, "rounds": self.original.repeats}


def time_graphs(graphs: dict, inputs, repeats: int = 11, min_time_s: float = 0.05,
                best_of: int = 1) -> dict:
    """Seconds per call of each ClosedJaxpr in ``graphs`` (name -> jaxpr) on ``inputs`` (one
    value per input of the jaxprs), each compiled with ``jax.jit``, timed in ``repeats``
    interleaved rounds of at least ``min_time_s`` each (enough calls that a round's ratio is
    stable on a shared machine), each round the fastest of ``best_of`` batches."""
    import jax

    from mlsys_jax.ir.interpret import lifted

    calls = {}
    for name, g in graphs.items():  # large constants (folded-in parameters) as arguments
        fn, big = lifted(g)
        calls[name] = partial(jax.jit(fn), big, *inputs)
    return timing.compare(calls, repeats=repeats, min_time_s=min_time_s, best_of=best_of)


SEARCH_ROUND_S = 0.02  # a search times several graphs: shorter rounds, still ≥ 20 ms each


def fastest(graphs: list, repeats: int = 7, seed: int = 0) -> dict:
    """Time ``graphs`` (ClosedJaxprs of one signature; the first is the reference) side by side
    on the same seeded random inputs.

    Returns ``{"candidates": [{"median_us", "min_us", "max_us", "repeats", "number"}, ...],
    "picked": index of the lowest median, "speedup": reference / picked (paired per round),
    "speedup_min", "speedup_max", "rounds"}``.
    """
    from mlsys_jax import ir

    inputs = ir.random_inputs(ir.input_structs(graphs[0]), seed=seed)
    times = time_graphs({str(i): g for i, g in enumerate(graphs)}, inputs, repeats=repeats,
                        min_time_s=SEARCH_ROUND_S)
    rows = [times[str(i)] for i in range(len(graphs))]
    picked = min(range(len(rows)), key=lambda i: rows[i].median_s)
    r = timing.ratio(rows[0], rows[picked])
    return {"candidates": [t.to_dict() for t in rows], "picked": picked, "speedup": r.median,
            "speedup_min": r.low, "speedup_max": r.high, "rounds": repeats}


def measure_speedup(original, optimized, inputs, repeats: int = 11) -> Speedup:
    """How much faster ``optimized`` runs than ``original`` here (median of paired rounds)."""
    t = time_graphs({"original": original, "optimized": optimized}, inputs, repeats)
    return Speedup(t["original"], t["optimized"], timing.ratio(t["original"], t["optimized"]))


def clearly_slower(times: dict, margin: float = 0.15) -> list[tuple[str, str]]:
    """Pairs ``(a, b)`` of measured graphs where ``a``'s median time exceeds ``b``'s by more
    than ``margin``: the order a measurement on a shared machine can vouch for."""
    return [(a, b) for a in times for b in times
            if times[a].median_s > (1 + margin) * times[b].median_s]


def order_disagreements(times: dict, estimated_us: dict, margin: float = 0.15) -> list:
    """The clearly ordered pairs (:func:`clearly_slower`) that the estimate orders otherwise."""
    return [(a, b) for a, b in clearly_slower(times, margin)
            if not estimated_us[a] > estimated_us[b]]
