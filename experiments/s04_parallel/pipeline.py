"""Experiment 04, demo 3 (lecture §5.3, §12 exercise 6): pipeline schedules as data and executed.

Every bubble and in-flight figure is counted on a built schedule table (and, for the executed
layout, on the executor's own idle steps); the formula (P-1)/(M+P-1) only sits beside it.
"""
from __future__ import annotations

from fractions import Fraction

import jax
import numpy as np

from experiments.s04_parallel.compare import TOL
from mlsys_jax import runtime
from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.schedules import bubble_formula, make_schedule, min_microbatches
from mlsys_jax.parallel.lecture.pipeline import (mse_loss, pipeline_value_and_grad,
                                             sequential_value_and_grad, tanh_chain_init,
                                             tanh_chain_stage)
from mlsys_jax.results import Check

# §5.3's picture and figures (the lecture's, typed in to compare with; ours are computed).
LECTURE_TIMELINE = ("GPU1 | F1 F2 F3 F4  .  . B4 B3 B2 B1",
                    "GPU2 |  . F1 F2 F3 F4 B4 B3 B2 B1  .")
LECTURE_BUBBLES = {(2, 1): 0.5, (2, 4): 0.2, (2, 64): 0.015}
SCHEDULE_NAMES = ("gpipe", "1f1b")
WIDE = 40  # steps beyond which a timeline is too wide to print


def devices_of(devices) -> list:
    """The devices a section may use: all of JAX's (None), the first N (an int), or those given."""
    if devices is None:
        return list(jax.devices())
    if isinstance(devices, int):
        return list(jax.devices())[:devices]
    return list(devices)


def _timeline_rows(stages: int, microbatches: int) -> list[dict]:
    rows = []
    for name in SCHEDULE_NAMES:
        sched = make_schedule(name, stages, microbatches)
        for line in sched.timeline().splitlines():
            rows.append({"P": stages, "M": microbatches, "schedule": name, "timeline": line})
    return rows


def _bubble_rows(cases) -> list[dict]:
    rows = []
    for p, m in cases:
        for name in SCHEDULE_NAMES:
            sched = make_schedule(name, p, m)
            counted, formula = sched.bubble_fraction(), bubble_formula(p, m)
            rows.append({"P": p, "M": m, "schedule": name, "steps": sched.steps,
                         "idle_slots": sum(c is None for row in sched.table for c in row),
                         "bubble": float(counted), "formula": float(formula),
                         "exact": counted == formula, "lecture": LECTURE_BUBBLES.get((p, m))})
    return rows


def _executor_rows(stages: int, microbatches: int, devs: list) -> list[dict]:
    """Run both schedules on a 'pipe' mesh; compare with the single-device model in float64."""
    if stages > len(devs):
        return [{"schedule": name, "note": f"skipped: {stages} stages need {stages} devices, "
                 f"{len(devs)} available (start with --devices {stages})"}
                for name in SCHEDULE_NAMES]
    mesh = make_mesh({"pipe": stages}, devices=devs[:stages])
    layers, width, per_mb = 2 * stages, 8, 2
    rng = np.random.default_rng(0)
    params = tanh_chain_init(rng, layers, width, stages, np.float64)
    x, y = rng.standard_normal((2, microbatches * per_mb, width))  # float64 host arrays
    ref_loss, ref_grads = jax.jit(sequential_value_and_grad, static_argnums=(0, 1))(
        tanh_chain_stage, mse_loss, params, x, y)
    rows = []
    for name in SCHEDULE_NAMES:
        sched = make_schedule(name, stages, microbatches, layers)
        got = pipeline_value_and_grad(sched, tanh_chain_stage, mse_loss, params, x, y, mesh)
        grad_diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in
                        zip(jax.tree.leaves(got.grads), jax.tree.leaves(ref_grads)))
        table_idle = [sum(row[s] is None for row in sched.table) for s in range(stages)]
        executed_idle = np.asarray(got.idle_steps).tolist()
        rows.append({"schedule": name, "P": stages, "M": microbatches, "layers": layers,
                     "loss": float(ref_loss), "loss_diff": abs(float(got.loss) - float(ref_loss)),
                     "grad_diff": grad_diff, "idle_executed": executed_idle,
                     "idle_table": table_idle, "stash_rows": got.buffer_rows,
                     "max_in_flight": max(sched.in_flight_peaks()),
                     "bubble_executed": float(Fraction(sum(executed_idle),
                                                       sched.steps * stages))})
    return rows


def pipeline_section(pp_stages: int = 2, microbatches: int = 4,
                     devices=None) -> dict[str, list[dict]]:
    """Demo 3 as tables: timeline, bubbles, exercise 6, in-flight peaks, the executor's equality."""
    runtime.enable_x64()  # the executor is compared with one device in float64
    if isinstance(pp_stages, bool) or not isinstance(pp_stages, int) or pp_stages < 1:
        raise MlsysError(f"experiment 04: pp_stages must be an integer >= 1, got {pp_stages!r}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise MlsysError(f"experiment 04: microbatches must be an integer >= 1, "
                         f"got {microbatches!r}")
    chosen = (pp_stages, microbatches)
    cases = list(dict.fromkeys([(2, 1), (2, 4), (2, 64), chosen]))
    timeline = _timeline_rows(2, 4)
    if chosen != (2, 4) and 2 * (microbatches + pp_stages - 1) <= WIDE:
        timeline += _timeline_rows(*chosen)
    bubbles = _bubble_rows(cases)
    ex6 = [{"schedule": name, "P": 4, "max_bubble": 0.1,
            "min_M": min_microbatches(4, 0.1, name),
            "bubble_at_min_M": float(make_schedule(name, 4, min_microbatches(4, 0.1, name))
                                     .bubble_fraction()),
            "lecture": 28} for name in SCHEDULE_NAMES]
    flight_cases = list(dict.fromkeys([(4, 8), chosen]))
    lecture_peaks = {("gpipe", (4, 8)): [8, 8, 8, 8], ("1f1b", (4, 8)): [4, 3, 2, 1]}
    flight = [{"schedule": name, "P": p, "M": m,
               "peak_in_flight": list(make_schedule(name, p, m).in_flight_peaks()),
               "lecture": lecture_peaks.get((name, (p, m)))}
              for p, m in flight_cases for name in SCHEDULE_NAMES]
    executor = _executor_rows(pp_stages, microbatches, devices_of(devices))

    return {"pipeline timeline (§5.3)": timeline, "pipeline bubble": bubbles,
            "exercise 6 (P=4, bubble < 10%)": ex6, "in-flight microbatches per stage": flight,
            "pipeline executor vs single device": executor}


def schedule_grids(p: int = 4, m: int = 8) -> dict[str, list[list[str | None]]]:
    """GPipe and 1F1B side by side as grids of cells (stage × step), titled with their bubble and
    peak in-flight microbatches: the in-flight example of §5.3, for the report's picture."""
    grids = {}
    for name in SCHEDULE_NAMES:
        sched = make_schedule(name, p, m)
        grids[f"{name}: P={p}, M={m}, bubble {float(sched.bubble_fraction()):.1%}, "
              f"peak in flight {list(sched.in_flight_peaks())}"] = [
            [None if c is None else str(c) for c in row] for row in sched.table]
    return grids


def pipeline_checks(tables: dict, chosen: tuple[int, int]) -> list[Check]:
    """§5.3's claims on the demo 3 tables (none if the section did not run); ``chosen`` is the
    (pp_stages, microbatches) setting the tables were built for."""
    if "pipeline bubble" not in tables:
        return []
    lines = tuple(r["timeline"] for r in tables["pipeline timeline (§5.3)"]
                  if (r["P"], r["M"], r["schedule"]) == (2, 4, "gpipe"))
    checks = [Check("GPipe timeline, 2 stages × 4 microbatches, as drawn in §5.3",
                    lines == LECTURE_TIMELINE, " / ".join(lines), " / ".join(LECTURE_TIMELINE))]
    bubbles = tables["pipeline bubble"]
    checks.append(Check("bubble counted on every schedule table == (P-1)/(M+P-1) exactly "
                        f"(P, M tried: {sorted({(r['P'], r['M']) for r in bubbles})}, "
                        f"incl. {chosen})",
                        all(r["exact"] for r in bubbles),
                        f"{sum(r['exact'] for r in bubbles)}/{len(bubbles)} tables exact",
                        "(P-1)/(M+P-1)"))
    for (p, m), lec in LECTURE_BUBBLES.items():
        got = next(r["bubble"] for r in bubbles if (r["P"], r["M"]) == (p, m))
        checks.append(Check(f"bubble P={p}, M={m} ≈ {lec:.1%} (§5.3)",
                            round(got, 3) == lec, round(got, 4), lec,
                            note=f"(P−1)/(M+P−1) = {got:.4%}; the lecture rounds to {lec:.1%}"))
    for r in tables["exercise 6 (P=4, bubble < 10%)"]:
        checks.append(Check(f"exercise 6 ({r['schedule']}): smallest M with bubble < 10% at P=4",
                            r["min_M"] == r["lecture"], r["min_M"], r["lecture"]))
    for r in tables["in-flight microbatches per stage"]:
        if r["lecture"] is not None:
            checks.append(Check(f"{r['schedule']} peak in-flight microbatches per stage, P=4, M=8",
                                r["peak_in_flight"] == r["lecture"], r["peak_in_flight"],
                                r["lecture"]))
    for r in tables["pipeline executor vs single device"]:
        if "note" in r:
            checks.append(Check(f"{r['schedule']} executor on a pipe mesh ({r['note']})", True,
                                r["note"]))
            continue
        checks.append(Check(f"{r['schedule']} executor (shard_map + ppermute), P={r['P']}, "
                            f"M={r['M']}: loss and grads == single device (float64)",
                            r["loss_diff"] < TOL and r["grad_diff"] < TOL,
                            max(r["loss_diff"], r["grad_diff"]), f"< {TOL}"))
        checks.append(Check(f"{r['schedule']} executor: idle steps run per stage == table's",
                            r["idle_executed"] == r["idle_table"], r["idle_executed"],
                            r["idle_table"]))
        checks.append(Check(f"{r['schedule']} executor: activation stash rows per device == "
                            "peak in-flight microbatches (GPipe M, 1F1B P)",
                            r["stash_rows"] == r["max_in_flight"], r["stash_rows"],
                            r["max_in_flight"]))
    return checks
