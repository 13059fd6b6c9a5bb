"""The honest headline of ``inspect`` and ``optimize``: the unfused and the fused estimate side
by side, and which one the hardware's compiler resembles (on ``cpu``, XLA:CPU fuses elementwise
loops: the fused one, which is also that hardware's default table); and how our FLOPs are
counted, in one line read off the cost rules (:func:`flop_convention`)."""
from __future__ import annotations

import functools
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

    @property
    def default_label(self) -> str:
        """The name of the default estimate: ``one kernel per op``, or the fused model's."""
        from mlsys_jax.cost.fusion import LABELS

        return LABELS[self.unfused.hardware.fusion] if self.default is self.fused else LABELS["none"]

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


def search_title(searched: dict) -> str:
    """The search table's title: how much was explored, and why it stopped."""
    explored, budget, alpha = searched["explored"], searched["budget"], searched["alpha"]
    tail = f"α={alpha}, {searched['seconds']:.2f} s"
    if explored == 0:
        after = ("the default pipeline's result" if any(r["rule"] == "pipeline"
                                                        for r in searched["path"])
                 else "the original graph")
        return f"[search: no move applies to {after}, nothing to explore; {tail}]"
    if explored >= budget:
        return f"[search path: {explored} graphs explored, the budget (--budget {budget}); {tail}]"
    return (f"[search path: {explored} graphs explored, every one within α of the best "
            f"(budget {budget} not reached); {tail}]")


def other_machine_note(hw_name: str) -> str:
    """Said beside a time measured here when the estimate is of another machine."""
    return "" if hw_name in ("cpu", "here") else " (this machine's CPU: compare with --hw here)"


def measured_line(measured: dict, hardware) -> str:
    """``optimize --measure``'s line: both medians, and the speedup as the median of the
    per-round ratios (not the ratio of the medians), with their spread."""
    rounds = measured["rounds"]
    return (f"measured here (jax.jit, {rounds} interleaved rounds): original "
            f"{measured['original_us']:.4g} µs, optimized {measured['optimized_us']:.4g} µs "
            f"(medians); speedup ×{measured['speedup']:.3g}, the median of the {rounds} rounds' "
            f"ratios original/optimized [{measured['speedup_min']:.3g}–"
            f"{measured['speedup_max']:.3g}]" + other_machine_note(hardware.name))


def predicted_beside_measured_line(measured: dict, hardware) -> str:
    """``optimize --measure``'s second line: each graph's estimate beside its measured median."""
    return (f"predicted on {hardware.name} (the tables' estimate) beside measured: original "
            f"{measured['original_predicted_us']:.4g} vs {measured['original_us']:.4g} µs, "
            f"optimized {measured['optimized_predicted_us']:.4g} vs "
            f"{measured['optimized_us']:.4g} µs")


@functools.lru_cache(maxsize=1)  # the rules do not change within a process
def flop_convention() -> str:
    """How our FLOPs are counted, in one line, read off the cost rules themselves
    (``cost.flop_rules``): each figure is what :func:`mlsys_jax.cost.model.eqn_flops` gives a
    probe program divided by its size, so the line cannot drift from what the rules do."""
    import jax.numpy as jnp
    from jax import lax

    def per(fn, size: int, *shapes) -> str:
        return f"{flops_of(fn, *shapes) / size:g}"

    matmul = per(jnp.matmul, 2 * 3 * 4, (2, 3), (3, 4))
    conv = per(lambda x, w: lax.conv(x, w, (1, 1), "VALID"), (1 * 2 * 2 * 2) * (3 * 3 * 3),
               (1, 3, 4, 4), (2, 3, 3, 3))
    elementwise = per(jnp.exp, 6, (6,))
    reduction = per(jnp.sum, 6, (6,))
    movement = per(jnp.transpose, 6, (2, 3))
    trips = flops_of(lambda x: lax.scan(lambda c, _: (jnp.exp(c), None), x, None, length=5)[0],
                     (6,)) / flops_of(jnp.exp, (6,))
    macs = (f"{matmul} per multiply-add (matmul, conv)" if matmul == conv else
            f"{matmul} per multiply-add of a matmul, {conv} of a conv")
    per_input = (f"{elementwise} per elementwise output and per reduction input"
                 if elementwise == reduction else
                 f"{elementwise} per elementwise output, {reduction} per reduction input")
    scans = "scan bodies once per trip" if trips == 5 else f"scan bodies ×{trips:g} for 5 trips"
    return f"FLOPs (ours): {macs}, {per_input}, {movement} for data movement, {scans}"


def flops_of(fn, *shapes) -> int:
    """Our FLOPs of ``fn`` traced on f32 arrays of ``shapes`` (its equations summed)."""
    import jax
    import jax.numpy as jnp

    from mlsys_jax.cost.model import eqn_flops

    closed = jax.make_jaxpr(fn)(*(jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes))
    return sum(eqn_flops(e)[0] for e in closed.jaxpr.eqns)
