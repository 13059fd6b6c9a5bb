"""Experiment 04's yardsticks: a parallel step against the single-device step (loss, gradients,
parameters), and a compiled program's collectives against the ring formula (lecture §5, §7.3)."""
from __future__ import annotations

from mlsys_jax.parallel import comm


from mlsys_jax.parallel.lecture import data
TOL = 1e-12  # float64: "equal" to the single-device step, up to rounding


def compile_run(fn, *args):
    """Compile once, quickly (identical HLO: comm.QUICK_COMPILE), and run."""
    return comm.compile_and_run(fn, *args, options=comm.QUICK_COMPILE)


def step_row(case, reduction, got, ref, lecture=None) -> dict:
    """Loss / grads / params differences of a (params, state, loss, grads) or (loss, grads) output."""
    loss, grads = (got[2], got[3]) if len(got) == 4 else (got[0], got[1])
    row = {"case": case, "reduction": reduction, "loss_diff": abs(float(loss) - float(ref[2])),
           "grad_diff": data.max_abs_diff(grads, ref[3])}
    if len(got) == 4:
        row["param_diff"] = data.max_abs_diff(got[0], ref[0])
    row["worst_diff"] = max(v for k, v in row.items() if k.endswith("_diff"))
    if lecture is not None:
        row["lecture"] = lecture
    return row


def comm_row(layout, hlo, n, result_bytes: dict) -> dict:
    """Measured ring bytes of the HLO collectives vs the formula from the collectives' payloads."""
    measured = comm.collectives(hlo, n)
    formula = sum(comm.ring_bytes(k, v, n) for k, v in result_bytes.items())
    got = comm.ring_total(measured)
    return {"layout": layout, "devices": n, "hlo_collectives": fmt_counts(
        comm.collective_counts(hlo)), "bytes_measured": got, "bytes_formula": formula,
        "match": abs(got - formula) < 1e-6}


def fmt_counts(counts) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(dict(counts).items()))
