"""``mlsys-jax bench [NAME ...]``: run the benchmarks side by side and report ratios.

The benchmarks and their runner live in the top-level ``benchmarks`` package (``bench_<name>.py``
each); this module is the command's front.
"""
from __future__ import annotations

HELP = "run benchmarks side by side, report ratios"


def add_arguments(p) -> None:
    p.add_argument("names", nargs="*", help="benchmark names (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quick", action="store_true", help="small sizes (the CI tier)")
    p.add_argument("--md", metavar="FILE", help="also write the figures as markdown (BENCHMARKS.md; "
                   "named benchmarks replace their own sections of an existing file)")


def main(args) -> int:
    from benchmarks import runner
    from mlsys_jax import runtime

    runtime.enable_x64()  # the parallel benchmark compares its layouts in float64
    return runner.main(args)
