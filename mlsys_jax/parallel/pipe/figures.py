"""Figures from what ran: the executed schedule, point-to-point bytes, memory per stage.

* **Bubble** from the executed log (the idle branches each device took) beside the table's
  count and the lecture's (P-1)/(M+P-1); **in flight** per stage from the same log (forwards
  minus backwards, its peak): 1F1B's P, P-1, ..., 1 vs GPipe's M.
* **Point-to-point bytes**: each ``collective-permute`` of the compiled program (its bytes and
  device pairs, read from the HLO) times the number of times it ran (counted by the program),
  beside the boundary's activation bytes x M forward plus its cotangents' x M backward.
* **Memory**: XLA's ``memory_analysis`` of the SPMD program (one program, so every device's
  buffers are the largest stage's, padding included) beside each stage's own bytes: its
  parameters, optimizer state, stash (in-flight peak x per-microbatch rows) and the temp bytes of
  its forward and backward compiled alone.
"""
from __future__ import annotations

import re
from fractions import Fraction

import jax
import numpy as np

from mlsys_jax.parallel.comm import collectives
from mlsys_jax.parallel.schedules import bubble_formula
from mlsys_jax.parallel.schedules import BACKWARD, BACKWARD_LOSS, FORWARD, IDLE

_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


def executed_bubble(log: np.ndarray, microbatches: int) -> dict:
    """Bubble and idle steps per stage from the executed log ``[steps, stages]`` of ops."""
    steps, stages = log.shape
    idle = [int(np.sum(log[:, s] == IDLE)) for s in range(stages)]
    return {"executed": Fraction(sum(idle), steps * stages), "idle_steps": idle,
            "formula": bubble_formula(stages, microbatches)}


def executed_in_flight(log: np.ndarray) -> list[int]:
    """Per stage, the most microbatches forwarded but not yet backwarded, as executed."""
    peaks = []
    for s in range(log.shape[1]):
        live = peak = 0
        for op in log[:, s]:
            live += 1 if op == FORWARD else -1 if op in (BACKWARD, BACKWARD_LOSS) else 0
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def timeline_table(log: np.ndarray, log_mb: np.ndarray) -> list[list[str | None]]:
    """The executed log as ``viz.schedule_grid`` cells: ``F3``, ``B3`` or None (idle)."""
    cell = {FORWARD: "F", BACKWARD: "B", BACKWARD_LOSS: "B"}
    return [[None if op == IDLE else f"{cell[int(op)]}{int(mb) + 1}"
             for op, mb in zip(row, row_mb)] for row, row_mb in zip(log, log_mb)]


def point_to_point(hlo: str, sends: np.ndarray, split, microbatches: int, stages: int,
                   data: int) -> dict:
    """Measured bytes per step and pipeline (one data replica) beside the formula."""
    from mlsys_jax.parallel.pipe.stagefn import is_float
    from mlsys_jax.ir.trace import aval_bytes

    per_boundary = {}
    found = [c for c in collectives(hlo) if c.kind == "collective-permute"]
    lines = [line for line in hlo.splitlines() if "collective-permute" in line and "=" in line
             and "-done" not in line]
    if len(lines) != len(found):
        raise AssertionError("collective-permute lines and parsed collectives disagree")
    for c, line in zip(found, lines):
        m = _PAIRS.search(line)
        pairs = [tuple(map(int, p.split(","))) for p in re.findall(r"\{(\d+,\d+)\}",
                                                                    m.group(1))] if m else []
        ends = {(a % stages, b % stages) for a, b in pairs}
        if len(ends) != 1:
            raise AssertionError(f"a collective-permute between several stage pairs: {ends}")
        a, b = ends.pop()
        k, direction = (a, 0) if b == a + 1 else (b, 1)
        ran = int(sends[direction, k])
        entry = per_boundary.setdefault(k, {"measured": 0, "sends": [0, 0]})
        entry["measured"] += c.result_bytes * (len(pairs) // data) * ran
        entry["sends"][direction] = ran
    rows = []
    for k in range(stages - 1):
        avals = [split.avals[v] for v in split.boundaries[k]]
        fwd = sum(aval_bytes(a) for a in avals)
        bwd = sum(aval_bytes(a) for a in avals if is_float(a))
        got = per_boundary.get(k, {"measured": 0, "sends": [0, 0]})
        rows.append({"boundary": k, "values": [str(a) for a in avals], "bytes": fwd,
                     "formula": microbatches * (fwd + bwd), "measured": got["measured"],
                     "sends": got["sends"]})
    measured, formula = sum(r["measured"] for r in rows), sum(r["formula"] for r in rows)
    return {"boundaries": rows, "measured": measured, "formula": formula,
            "ratio": measured / formula if formula else None}


def stage_memory(plan, in_flight, compiled, options=None, compile_stages=True) -> dict:
    """Per-stage bytes (exact; ``compile_stages``: with each stage's forward and backward
    compiled alone) beside the SPMD program's memory_analysis (padded)."""
    prog = plan.program
    rows = []
    for s in range(plan.stages):
        act = prog.msg[s - 1].nbytes if s and prog.msg else 0
        res = prog.res_layouts[s].nbytes if prog.res_layouts else 0
        rows.append({"stage": s, "params": plan.leaves.bytes_per_stage()[s],
                     "optimizer_state": plan.popt.state_layouts[s].nbytes,
                     "stash_per_microbatch": act + res, "in_flight": in_flight[s],
                     "stash": in_flight[s] * (act + res),
                     "compiled_temp": _stage_temp_bytes(plan, s, options) if compile_stages
                     else None})
    ma = compiled.memory_analysis()
    padded = {"params": plan.leaves.own[0].padded_bytes + plan.leaves.rep.padded_bytes,
              "optimizer_state": plan.popt.state_layouts[0].padded_bytes,
              "stash_rows": prog.rows,
              "stash_row": (prog.msg[0].padded_bytes if prog.msg else 0) +
              (prog.res_layouts[0].padded_bytes if prog.res_layouts else 0)}
    return {"stages": rows, "padded": padded,
            "program": {"arguments": int(ma.argument_size_in_bytes),
                        "outputs": int(ma.output_size_in_bytes),
                        "temp": int(ma.temp_size_in_bytes)}}


def _stage_temp_bytes(plan, s: int, options) -> int:
    """XLA temp bytes of stage s's forward and backward for one microbatch, compiled alone."""
    from mlsys_jax.parallel.pipe.stagefn import differentiable

    io = plan.program.io[s]

    def fwd_bwd(leaf_vals, acts, batch):
        g = differentiable(plan.split, s, io, acts, batch)
        outs, vjp, _ = jax.vjp(g, tuple(leaf_vals), tuple(acts[i] for i in io.float_in),
                               has_aux=True)
        return vjp(tuple(jax.numpy.ones_like(o) for o in outs))

    structs = [[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in group]
               for group in (io.leaf_avals, io.in_avals, io.batch_avals)]
    compiled = jax.jit(fwd_bwd).lower(*structs).compile(options)
    return int(compiled.memory_analysis().temp_size_in_bytes)


def stacked_share(plan) -> dict | None:
    """Bytes of the leaves cut by rows (a stack's parameters): per stage and in total."""
    cut = [i for i, p in enumerate(plan.split.placements) if p.kind == "rows"]
    if not cut:
        return None
    from mlsys_jax.ir.trace import aval_bytes
    total = sum(aval_bytes(plan.leaves.avals[i]) for i in cut)
    per = []
    for s in range(plan.stages):
        per.append(sum(aval_bytes(plan.leaves.slice_aval(l, lo, hi))
                       for l, lo, hi in plan.leaves.own_entries[s] if l in cut))
    return {"total": total, "per_stage": per,
            "max_over_equal_share": max(per) / (total / plan.stages)}
