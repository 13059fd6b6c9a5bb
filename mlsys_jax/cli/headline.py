"""The honest headline of ``inspect`` and ``optimize``: the unfused and the fused estimate side
by side, and which one the hardware's compiler resembles (on ``cpu``, XLA:CPU fuses elementwise
loops: the fused one, which is also that hardware's default table)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Estimates:
    """One graph costed both ways on one hardware model."""

    unfused: object  # cost.CostReport, one kernel per op
    fused: object    # cost.CostReport, the hardware's fusion model

    @property
    def default(self):
        """The report a table shows by default: the hardware's (fused on ``cpu``)."""
        return self.fused if self.unfused.hardware.fused_default else self.unfused

    def totals(self) -> dict:
        """The unfused totals (``kernels``, ``time_us``, ...) with ``fused_kernels`` and
        ``fused_time_us`` beside them (the ``--json`` form)."""
        return {**self.unfused.totals(), "fused_kernels": len(self.fused.kernels),
                "fused_time_us": self.fused.time_us}

    def line(self) -> str:
        """``one kernel per op: 169 kernels, 681.7 µs · fused (...): 42 kernels, 171.3 µs``."""
        from mlsys_jax.cost.fusion import LABELS

        hw = self.unfused.hardware
        if hw.timer is not None:  # measured: one call per op is eager execution
            parts = [("one call per op (eager), measured", self.unfused),
                     ("XLA's fused kernels, measured", self.fused)]
        else:
            parts = [(LABELS["none"], self.unfused), (LABELS[hw.fusion], self.fused)]
        return " · ".join(f"{label}: {len(r.kernels)} kernels, {r.time_us:.4g} µs"
                          for label, r in parts)


def estimates(closed, hw, dtype) -> Estimates:
    from mlsys_jax.cost import estimate

    # the fused estimate first: on a measured model (``here``) the default table's kernels are
    # measured before a time budget can run out
    fused = estimate(closed, hw=hw, dtype=dtype, fused=True)
    return Estimates(estimate(closed, hw=hw, dtype=dtype, fused=False), fused)


def compiler_note(hardware) -> str:
    """Which estimate the hardware's compiler resembles, in a sentence."""
    return f"on {hardware.name}, {hardware.compiler}"


def speedup_line(before: Estimates, after: Estimates) -> str:
    """Predicted speedups, unfused and fused."""
    ratio = lambda a, b: a.time_us / b.time_us if b.time_us else float("inf")  # noqa: E731
    return (f"predicted speedup: one kernel per op ×{ratio(before.unfused, after.unfused):.3g}, "
            f"fused ×{ratio(before.fused, after.fused):.3g}")
