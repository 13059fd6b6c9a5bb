"""The 'cpu' cost model against XLA:CPU (figures of ``bench passes``): the calibrated bandwidth
checked against NumPy's copy, and the estimate's order checked against the measured order on
the §4.2 block (original, folded, enlarged, final) and, outside ``--quick``, on a flax
ResNet-18-style net (original vs optimized, with measured beside predicted speedup)."""
from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache, partial
from pathlib import Path

import jax

from mlsys_jax import cost, ir, passes as P
from mlsys_jax.passes.registry import pipeline as default_pipeline

from benchmarks import building
from benchmarks._resnet_block import traced_block

FLAX_RESNET = Path(__file__).resolve().parents[1] / "examples" / "flax_resnet.py"


def bandwidth() -> tuple[dict, list]:
    s = cost.hardware.stream_bandwidths()
    note = ("'cpu' bandwidth calibration (x + 1 on a donated 64 MiB buffer, in place) {:.3g} GB/s "
            "vs NumPy's copy into a preallocated buffer {:.3g} GB/s, interleaved rounds: ratio "
            "{:.3g} (target 0.5–3; a fresh 64 MiB output would time the allocation instead)")
    return ({"cpu_calibrated_bandwidth_over_numpy_copy_ratio": s["ratio"]},
            [note.format(s["xla_in_place"] / 1e9, s["numpy_copy"] / 1e9, s["ratio"])])


def block_order(quick: bool) -> tuple[dict, list]:
    from experiments.s02_graph_opt.xla_cpu import measure_cpu

    shape = (4, 64, 28, 28)  # (n, c, h, w)
    _, steps = traced_block(shape)
    cpu = measure_cpu(steps, shape, repeats=3 if quick else 9)
    figures = {"resnet_block_cpu_estimate_order_matches": int(not cpu["disagree"]),
               "resnet_block_cpu_speedup_spread": cpu["speedup_spread"]}
    return figures, [cpu["note"]]


@lru_cache(maxsize=None)  # one module a file: its jitted setup (init) compiles once
def _example(path: Path):
    """The example file at ``path`` as a module, its folder on the import path while it loads
    (the examples import each other, as the CLI puts a target's folder on the path)."""
    spec = importlib.util.spec_from_file_location(f"_bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def flax_resnet() -> tuple[dict, list]:
    from mlsys_jax.cost.measure import measure_speedup

    try:
        import flax  # noqa: F401
    except ImportError:
        return {}, ["flax ResNet figures skipped: flax is not installed (the 'ecosystem' extra)"]
    with jax.enable_x64(False):  # a user's model, under JAX's defaults
        with building():
            apply, (variables, x) = _example(FLAX_RESNET).inspect()
        closed = ir.trace(partial(apply, variables), x)  # inference: parameters are constants
        after = P.run(default_pipeline(), closed, verify=True, cost=False).jaxpr
        hw = cost.get_hardware("cpu")
        est = {k: cost.estimate(g, hw=hw).time_us for k, g in (("original", closed),
                                                                ("optimized", after))}
        measured = measure_speedup(closed, after, [x], repeats=11)
    predicted = est["original"] / est["optimized"]
    r = measured.ratio
    separated = r.low > 1 or r.high < 1  # every round agrees on which graph is faster
    agrees = not separated or (r.median > 1) == (predicted > 1)
    figures = {"flax_resnet_cpu_estimate_order_matches": int(agrees),
               "flax_resnet_measured_over_predicted_speedup_ratio": r.median / predicted}
    notes = [f"flax ResNet-18-style net (examples/flax_resnet.py, 2×32×32×3 f32), default "
             f"pipeline: predicted speedup on 'cpu' (XLA:CPU's loop fusion) ×{predicted:.3g}, "
             f"measured under jax.jit ×{r.median:.3g} [{r.low:.3g}–{r.high:.3g}] (paired, "
             f"{measured.original.repeats} rounds); the order "
             + ("agrees" if agrees else "disagrees")
             + ("" if separated else " (the rounds do not separate the two graphs)")]
    return figures, notes


def run(quick: bool = False) -> tuple[dict, list]:
    figures, notes = {}, []
    parts = (bandwidth(), block_order(quick)) + (() if quick else (flax_resnet(),))
    for part in parts:
        figures.update(part[0])
        notes += part[1]
    return figures, notes
