"""``mlsys-jax bench [NAME ...]``: run the benchmarks side by side and report ratios.

The benchmarks and their runner live in the top-level ``benchmarks`` package (``bench_<name>.py``
each); this module is the command's front. Its ``--help`` lists them (:func:`listing`) with how
long each took the last time it ran on this machine, in the full tier and with ``--quick``, as the
runner recorded it (``benchmarks.record_run``); nothing of it imports JAX.
"""
from __future__ import annotations

HELP = "run benchmarks side by side, report ratios"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="benchmark names, listed below (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="small sizes (the CI tier)")
    p.add_argument("--md", metavar="FILE", help="also write the figures as markdown (BENCHMARKS.md; "
                   "named benchmarks replace their own sections of an existing file)")


def listing(width: int, *, here: bool = True) -> str:
    """The benchmarks, what each measures and (``here``) how long its last full and ``--quick``
    runs took on this machine; ``here=False`` (the reference in docs/cli.md) leaves the times out,
    since they are this machine's alone."""
    import benchmarks
    from mlsys_jax.tables import format_table, wrap

    runs = benchmarks.last_runs() if here else {}
    rows = []
    for name in benchmarks.discover():
        row = {"NAME": name}
        if here:
            row["last run here"] = _run_times(runs.get(name, {}))
        rows.append({**row, "what it measures": benchmarks.title(name)})
    out = [format_table(rows, "benchmarks:", width=width)]
    if not here:
        out.append(wrap("mlsys-jax bench --help adds how long each benchmark's last full and "
                        "--quick runs took on your machine.", first="", width=width))
    return "\n".join(out)


def _run_times(tiers: dict[str, float]) -> str:
    """``245 s, --quick 31 s``: the last time of each tier that ran here (full first)."""
    said = {"full": "", "quick": "--quick "}
    times = [f"{said[t]}{_seconds(tiers[t])}" for t in ("full", "quick") if t in tiers]
    return ", ".join(times) or "not yet"


def _seconds(s: float) -> str:
    """Seconds as a person reads a run time: ``0.8 s``, ``42 s``, ``11 min``."""
    if s < 10:
        return f"{s:.1f} s"
    if s < 600:
        return f"{s:.0f} s"
    return f"{s / 60:.0f} min"


def main(args) -> int:
    from benchmarks import runner
    from mlsys_jax import runtime

    runtime.enable_x64()  # the parallel benchmark compares its layouts in float64
    return runner.main(args)
