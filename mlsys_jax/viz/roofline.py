"""``inspect --plot``: the roofline chart performance engineers read first (Williams, Waterman
and Patterson, 2009) — attainable FLOP/s against arithmetic intensity, the hardware's roof and
ridge point, and one marker per row of the table (a module, or with ``--ops`` a kernel) at its
FLOPs over its estimated time, its area proportional to that time. A marker below the roof is
held down by launch overhead or by mixing compute- and memory-bound kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlsys_jax.viz.plots import _pyplot, _save, unavailable_reason

LABELLED = 8  # the markers with the largest times get their names written beside them


@dataclass(frozen=True)
class Point:
    """One marker: a table row's name, FLOPs, bytes, estimated time (µs) and regime."""

    name: str
    flops: int
    bytes: int
    time_us: float
    bound: str
    dtype: str = "f32"

    @property
    def intensity(self) -> float:
        """Arithmetic intensity: FLOPs per byte moved (the roofline's x axis)."""
        return self.flops / self.bytes

    @property
    def flop_per_s(self) -> float:
        """Achieved FLOP/s (the roofline's y axis)."""
        return self.flops / (self.time_us * 1e-6)


@dataclass(frozen=True)
class RooflinePlot:
    """What was drawn: the file, its markers (read back from the figure) and the rows left out
    (no FLOPs or no bytes: nowhere on log axes)."""

    path: str
    drawn: tuple     # (x, y) of every marker, in the order of ``points``
    points: tuple    # the Points drawn
    left_out: tuple  # names


def points_of_rows(rows, fused: bool) -> list[Point]:
    """The markers of a module table's rows (``cli.summary.ModuleSummary.leaves()``)."""
    out = []
    for r in rows:
        c = r.cost
        out.append(Point(r.name if r.depth == 1 else "/".join(c.path[-2:]) if r.name == "(self)"
                         else r.name, c.flops, c.fused_bytes if fused else c.unfused_bytes,
                         c.fused_us if fused else c.unfused_us, c.bound[0]))
    return out


def points_of_kernels(report) -> list[Point]:
    """The markers of a cost report's kernels (``inspect --ops``)."""
    return [Point(k.name, k.flops, k.bytes, k.time_us, k.bound, k.dtype) for k in report.kernels]


def roofline(path: str, points: list[Point], hw, title: str) -> RooflinePlot | None:
    """Draw ``points`` under ``hw``'s roofs (one per dtype the points compute in)."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    shown = [p for p in points if p.flops > 0 and p.bytes > 0 and p.time_us > 0]
    left_out = tuple(p.name for p in points if p not in shown)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    xs = [p.intensity for p in shown]
    ridges = {d: hw.peak(d) / hw.bandwidth for d in dict.fromkeys(p.dtype for p in shown)} or \
        {"f32": hw.peak("f32") / hw.bandwidth}
    lo = min(xs + list(ridges.values())) / 4
    hi = max(xs + list(ridges.values())) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    for dtype, ridge in ridges.items():
        peak = hw.peak(dtype)
        ax.plot(grid, [min(peak, hw.bandwidth * x) for x in grid], "k-", lw=1.2,
                label=f"roof ({dtype}: {peak / 1e12:.4g} TFLOP/s, {hw.bandwidth / 1e9:.4g} GB/s)")
        ax.axvline(ridge, color="gray", linestyle=":", label=f"ridge {ridge:.3g} FLOP/B ({dtype})")
    total = sum(p.time_us for p in shown) or 1.0
    colors = {"compute": "#c44e52", "memory": "#4c72b0"}
    drawn = ax.scatter(xs, [p.flop_per_s for p in shown],
                       s=[20 + 2000 * p.time_us / total for p in shown],
                       c=[colors.get(p.bound, "#999999") for p in shown], alpha=0.6,
                       edgecolors="black", linewidths=0.5)
    for regime, color in colors.items():
        ax.scatter([], [], c=color, label=f"{regime}-bound", s=40)
    for p in sorted(shown, key=lambda p: -p.time_us)[:LABELLED]:
        ax.annotate(p.name, (p.intensity, p.flop_per_s), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
           ylabel="FLOP/s (roof: attainable; markers: FLOPs / estimated time)", title=title)
    ax.title.set_fontsize(9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small", loc="lower right")
    offsets = tuple(tuple(map(float, xy)) for xy in drawn.get_offsets())
    _save(fig, path)
    return RooflinePlot(path, offsets, tuple(shown), left_out)
