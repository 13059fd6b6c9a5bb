"""What ``inspect`` and ``optimize`` add for measurements: the ``--measure-budget`` of the
``here`` model, its measured columns and roofline efficiency, and a whole function timed under
``jax.jit`` beside its prediction."""
from __future__ import annotations

from mlsys_jax.errors import MlsysError

WORST = 3  # kernels named by the efficiency line
FAR_BELOW = 3.0  # --hw cpu: a roofline estimate this many times under a probe gets the hint
PROBE_S = 0.3    # the probe's time: a few calls of the compiled function


def add_budget_argument(p) -> None:
    from mlsys_jax.defaults import MEASURE_BUDGET_S  # not mlsys_jax.cost: --help starts no JAX

    p.add_argument("--measure-budget", type=float, default=None, metavar="S",
                   help=f"--hw here: seconds to spend measuring new kernels (default "
                        f"{MEASURE_BUDGET_S:g}); kernels beyond it keep the roofline, marked")


def check_here_options(args) -> None:
    """Check ``--measure-budget`` (and that ``--dtype`` is not asked of ``here``, which times
    the graph's own dtypes) and give the budget to this process's ``here`` model."""
    here = args.hw.strip().lower() == "here"
    if here and args.dtype is not None:
        raise MlsysError(f"--dtype {args.dtype}: --hw here times every kernel in the graph's own "
                         "dtypes; drop --dtype (or cost on a roofline model, e.g. --hw cpu)")
    if here and getattr(args, "alpha", None) is not None:
        raise MlsysError("--alpha prunes a search on a roofline model; with --hw here every "
                         "graph within --budget is kept (its costs are measured here): drop "
                         "--alpha")
    budget = getattr(args, "measure_budget", None)
    if budget is not None and not budget >= 0:
        raise MlsysError(f"--measure-budget must be a number of seconds ≥ 0, got {budget}")
    if budget is not None and not here:
        raise MlsysError("--measure-budget sets how long the 'here' model measures kernels; add "
                         "--hw here (or drop it)")
    if here:  # every command gets its own budget
        from mlsys_jax.cost.hardware import MEASURE_BUDGET_S
        from mlsys_jax.cost.here.operators import operator_model

        model = operator_model()
        model.budget_s, model.spent_s = MEASURE_BUDGET_S if budget is None else budget, 0.0
        model.shown = None  # both sets measured unless the command says which one it shows
        model.side = None


def kernel_fields(report, k) -> dict:
    """A measured model's fields of one kernel (none on a roofline model)."""
    if not report.measured:
        return {}
    return {"model": k.model, "run_us": k.run_us, "bound_us": k.bound_us,
            "x_roofline": k.efficiency, **({"why": k.why} if k.why else {})}


def table_columns(report) -> tuple:
    """The kernel table's extra columns on a measured model."""
    return ("model", "x_roofline") if report.measured else ()


def efficiency_line(report) -> str:
    """How far the measured kernels run from the roofline, naming the least efficient, and how
    many kept the roofline (and why); empty on a roofline model."""
    if not report.measured:
        return ""
    rated = sorted((k for k in report.kernels if k.efficiency is not None),
                   key=lambda k: k.efficiency, reverse=True)
    counts = {m: sum(k.model == m for k in report.kernels) for m in ("measured", "cached",
                                                                     "derived", "roofline")}
    derived = f"{counts['derived']} derived, " if counts["derived"] else ""
    parts = [f"kernels: {counts['measured']} measured now, {counts['cached']} from the cache, "
             f"{derived}{counts['roofline']} on the roofline; dispatch of the call "
             f"{report.overhead_us:.3g} µs"]
    if rated:
        names = ", ".join(f"{k.name} ({', '.join(k.in_shapes)}) ×{k.efficiency:.3g} "
                          f"({k.run_us:.4g} vs {k.bound_us:.3g} µs)" for k in rated[:WORST])
        parts.append(f"measured time over roofline time: least efficient {names}")
    why = sorted({k.why for k in report.kernels if k.why and k.model == "roofline"})
    if why:
        parts.append("on the roofline because: " + "; ".join(why))
    return ". ".join(parts)


def time_whole(closed, inputs, rounds: int):
    """The whole function compiled with ``jax.jit`` and timed here (``rounds`` rounds, each the
    best of two batches of ≥ 50 ms; the median is the figure)."""
    from mlsys_jax.cost.measure import time_graphs

    return time_graphs({"f": closed}, inputs, repeats=rounds, best_of=2)["f"]


def measured_dict(predicted_us: float, timing) -> dict:
    """``inspect --measure --json``'s ``measured``: the estimate beside the jit-timed medians."""
    return {"predicted_us": predicted_us, "median_us": timing.median_us,
            "min_us": timing.min_s * 1e6, "max_us": timing.max_s * 1e6, "rounds": timing.repeats,
            "predicted_over_measured": predicted_us / timing.median_us}


def prediction_line(label: str, model_name: str, predicted_us: float, timing) -> str:
    return (f"{label}: predicted {predicted_us:.4g} µs ({model_name}), measured "
            f"{timing.summary()} under jax.jit: predicted/measured "
            f"{predicted_us / timing.median_us:.3g}")


def quick_probe_us(compiled, inputs, *, budget_s: float = PROBE_S) -> float:
    """µs of one call of ``compiled`` (``inspect``'s program, compiled for XLA's figures) on the
    function's inputs: the fastest of a few calls after a warm one, within ``budget_s`` — a
    probe, not a measurement (``--measure`` is one)."""
    import time

    import jax

    jax.block_until_ready(compiled(*inputs))
    best, start = float("inf"), time.perf_counter()
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best * 1e6


def roofline_hint(report, probe_us: float | None, *, measured: bool = False) -> str:
    """On ``--hw cpu``: when the roofline estimate is far below what this machine took (a quick
    probe, or ``--measure``), say that it is a bound and that ``--hw here`` predicts this
    machine; empty otherwise."""
    if report.hardware.name != "cpu" or not probe_us or report.time_us <= 0:
        return ""
    times = probe_us / report.time_us
    if times < FAR_BELOW:
        return ""
    how = ("what --measure timed here" if measured else
           "what a quick probe took here (the fastest of a few jit calls)")
    return (f"the cpu roofline ({report.time_us:.4g} µs) is a bound, {times:.3g}× below {how}: "
            f"{probe_us:.4g} µs; --hw here predicts this machine (each kernel compiled and "
            f"timed here, cached)")


def fused_contractions_line(counts: list) -> str:
    """``--hw here``: XLA runs some contractions together in one kernel (a YNNPACK graph of
    convolutions, their elementwise work and a reduction); the model times a run of its kernels
    that matches one as one program (``cost/here/graphs.py``), any other contraction alone —
    said with the counts."""
    sizes = ", ".join(str(n) for n in counts)
    return (f"XLA compiled {sum(counts)} contractions into {len(counts)} kernel(s) of several "
            f"each ({sizes}: a YNNPACK graph fusion): a run of this model's kernels that matches "
            f"one is timed as one program and its time shared among them (their rows say so); "
            f"a contraction outside such a run is timed alone, which can be far from XLA's "
            f"(measure the whole function with --measure)")
