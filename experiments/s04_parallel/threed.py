"""Experiment 04, 3D parallelism (lecture §5.4): one data × tensor × pipeline = 2×2×2 Adam step
against the single-device step."""
from __future__ import annotations

from experiments.s04_parallel.compare import TOL
from experiments.s04_parallel.pipeline import devices_of
from mlsys_jax import runtime
from mlsys_jax.parallel.lecture.threed import compare_3d
from mlsys_jax.results import Check

TABLE = "3D step vs single device"
LAYOUT = "data 2 × tensor 2 × pipe 2"
CLAIM = f"3D ({LAYOUT}, 1F1B) Adam step: loss, grads, params == 1 device"


def threed_section(devices=None) -> dict[str, list[dict]]:
    """The 3D step's differences from one device, as a one-row table (a note when < 8 devices)."""
    runtime.enable_x64()
    devs = devices_of(devices)
    if len(devs) < 8:
        note = (f"skipped: the 2×2×2 mesh needs 8 devices, {len(devs)} available "
                "(start with --devices 8 or more)")
        return {TABLE: [{"layout": LAYOUT, "note": note}]}
    got = compare_3d(devices=devs[:8])
    return {TABLE: [{"layout": LAYOUT, "schedule": "1f1b", "microbatches": 2,
                     "loss": got["loss"], "loss_diff": got["loss_diff"],
                     "grad_diff": got["grad_diff"], "param_diff": got["param_diff"],
                     "param_change": got["param_change"]}]}


def threed_checks(tables: dict) -> list[Check]:
    """§5.4's claim on the 3D table (none if the section did not run)."""
    if TABLE not in tables:
        return []
    row = tables[TABLE][0]
    if "note" in row:
        return [Check(CLAIM, True, row["note"])]
    worst = max(row["loss_diff"], row["grad_diff"], row["param_diff"])
    return [Check(CLAIM, worst < TOL, worst, f"< {TOL}")]
