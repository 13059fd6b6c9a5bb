"""What ``inspect`` and ``optimize`` add for measurements: the ``--measure-budget`` of the
``here`` model, its measured columns and roofline efficiency, and a whole function timed under
``jax.jit`` beside its prediction."""
from __future__ import annotations

from mlsys_jax.errors import MlsysError

WORST = 3  # kernels named by the efficiency line


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
                                                                     "roofline")}
    parts = [f"kernels: {counts['measured']} measured now, {counts['cached']} from the cache, "
             f"{counts['roofline']} on the roofline; dispatch of the call "
             f"{report.overhead_us:.3g} µs"]
    if rated:
        names = ", ".join(f"{k.name} ({', '.join(k.in_shapes)}) ×{k.efficiency:.3g} "
                          f"({k.run_us:.4g} vs {k.bound_us:.3g} µs)" for k in rated[:WORST])
        parts.append(f"measured time over roofline time: least efficient {names}")
    why = sorted({k.why for k in report.kernels if k.why})
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
