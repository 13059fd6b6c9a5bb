"""The memory timeline of a recomputation plan: bytes held over the step (``remat --plot``)."""
from __future__ import annotations

from typing import Mapping, Sequence

from mlsys_jax.viz.plots import _pyplot, _save, unavailable_reason

__all__ = ["timeline", "unavailable_reason"]


def timeline(path: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
             lines: Mapping[str, float], *, title: str) -> str | None:
    """One step curve per series (label -> (positions, bytes)), labelled horizontal lines (the
    budget, compiled temp bytes); MB on the y axis. None without matplotlib."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for label, (xs, ys) in series.items():
        ax.step(xs, [y / 1e6 for y in ys], where="post", label=f"{label} (the planner's model)")
    for (label, y), style in zip(lines.items(), ("-", "--", ":", "-.")):
        ax.axhline(y / 1e6, linestyle=style, color="gray", label=f"{label}: {y / 1e6:.4g} MB")
    n = max((max(xs) for xs, _ in series.values()), default=0) / 2
    if n:
        ax.axvline(n, color="black", linewidth=0.5)
        ax.text(n / 2, ax.get_ylim()[1] * 0.97, "forward", ha="center", va="top")
        ax.text(1.5 * n, ax.get_ylim()[1] * 0.97, "backward", ha="center", va="top")
    ax.set_xlabel("position in the step (equations of the loss, forward then backward)")
    ax.set_ylabel("activation bytes held (MB)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)
