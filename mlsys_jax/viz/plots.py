"""Optional PNG plots (the ``plot`` extra): matplotlib is imported only when a plot is drawn.

Without matplotlib every function returns None and :func:`unavailable_reason` says why, so an
experiment can record "plots skipped: ..." instead of failing.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence


def unavailable_reason() -> str | None:
    """None if PNGs can be drawn; otherwise why not (for the experiment's notes)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        return (f"plots skipped: matplotlib is not installed ({e}); "
                "install the plot extra: pip install -e '.[plot]'")
    return None


def plot_notes(paths: Sequence[str]) -> list[str]:
    """Notes for an experiment's result: the PNGs written, or why none were."""
    reason = unavailable_reason()
    return [reason] if reason else [f"plot written: {p}" for p in paths]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    _pyplot().close(fig)
    return path


def lines(path: str, series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
          xlabel: str, ylabel: str, title: str, log: bool = False,
          hlines: Mapping[str, float] = {}, vlines: Mapping[str, float] = {}) -> str | None:
    """One line per series (label -> (xs, ys)), optional labelled reference lines; log-log if asked."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", label=label)
    for label, y in hlines.items():
        ax.axhline(y, linestyle="--", color="gray", label=label)
    for label, x in vlines.items():
        ax.axvline(x, linestyle=":", color="black", label=label)
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def stacked_bars(path: str, groups: Sequence[str], stacks: Mapping[str, Sequence[float]], *,
                 ylabel: str, title: str,
                 markers: Mapping[str, Sequence[float | None]] = {}) -> str | None:
    """Stacked bars: one bar per group, one coloured segment per stack (label -> value per group);
    ``markers`` (label -> value per group, None to skip) are drawn as points over the bars."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    bottom = [0.0] * len(groups)
    for label, values in stacks.items():
        ax.bar(groups, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    for label, values in markers.items():
        pts = [(g, v) for g, v in zip(groups, values) if v is not None]
        ax.plot([g for g, _ in pts], [v for _, v in pts], "kD", label=label)
    ax.set(ylabel=ylabel, title=title)
    ax.set_ylim(0, 1.45 * max(bottom + [v for vs in markers.values() for v in vs if v is not None]))
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(loc="upper right", ncol=2, fontsize="small")  # above the bars (headroom from ylim)
    return _save(fig, path)


def schedule_grid(path: str, tables: Mapping[str, Sequence[Sequence[str | None]]], *,
                  title: str) -> str | None:
    """Pipeline timelines as coloured grids: per schedule, rows = stages, columns = time steps;
    cells are "F<i>"/"B<i>" (forward/backward of microbatch i) or None (a bubble)."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(len(tables), 1, figsize=(8, 1.3 + 1.1 * sum(len(t[0]) for t in tables.values())),
                             squeeze=False)
    for ax, (name, table) in zip(axes[:, 0], tables.items()):
        steps, stages = len(table), len(table[0])
        for t, row in enumerate(table):
            for s, cell in enumerate(row):
                color = "#eeeeee" if cell is None else ("#4c72b0" if cell.startswith("F") else "#dd8452")
                ax.add_patch(plt.Rectangle((t, stages - 1 - s), 1, 1, facecolor=color, edgecolor="white"))
                ax.text(t + 0.5, stages - 0.5 - s, cell or "·", ha="center", va="center",
                        color="white" if cell else "gray", fontsize=8)
        ax.set(xlim=(0, steps), ylim=(0, stages), xlabel="time step", title=name,
               yticks=[stages - 0.5 - s for s in range(stages)],
               yticklabels=[f"GPU{s + 1}" for s in range(stages)])
        ax.set_xticks(range(0, steps + 1, max(1, steps // 12)))
    fig.suptitle(title + "  (blue: forward, orange: backward, grey: bubble)", fontsize=9)
    return _save(fig, path)


def bars(path: str, labels: Sequence[str], series: Mapping[str, Sequence[float]], *,
         ylabel: str, title: str) -> str | None:
    """Grouped bars: one group per label, one bar per series."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([j + i * width for j in range(len(labels))], values, width, label=name)
    ax.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    return _save(fig, path)


def roofline_steps(path: str, steps: Mapping[str, Sequence[Mapping]], *, peak_flops: float,
                   bandwidth: float, title: str) -> str | None:
    """Left: the roofline (attainable FLOP/s vs arithmetic intensity) with every kernel of every
    step placed on it; right: each step's estimated time, one stacked segment per kernel."""
    if unavailable_reason():
        return None
    plt = _pyplot()
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.5))
    ais = [k["flops"] / k["bytes"] for ks in steps.values() for k in ks if k["bytes"] and k["flops"]]
    lo, hi = min(ais + [1.0]) / 4, max(ais + [peak_flops / bandwidth]) * 4
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [min(peak_flops, bandwidth * x) / 1e12 for x in xs], "k-", label="roofline")
    ax.axvline(peak_flops / bandwidth, color="gray", linestyle=":",
               label=f"ridge {peak_flops / bandwidth:.0f} FLOP/B")
    markers = "osD^v<>p"
    for i, (name, ks) in enumerate(steps.items()):
        pts = [(k["flops"] / k["bytes"], min(peak_flops, bandwidth * k["flops"] / k["bytes"]) / 1e12)
               for k in ks if k["bytes"] and k["flops"]]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=markers[i % len(markers)],
                   s=60, alpha=0.7, label=name)
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP/byte)",
           ylabel="attainable TFLOP/s", title="kernels on the roofline")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="x-small")
    names = list(steps)
    bottom = [0.0] * len(names)
    for j in range(max(len(ks) for ks in steps.values())):
        seg = [ks[j]["time_us"] if j < len(ks) else 0.0 for ks in steps.values()]
        bx.bar(range(len(names)), seg, bottom=bottom, edgecolor="white")
        bottom = [b + v for b, v in zip(bottom, seg)]
    for i, ks in enumerate(steps.values()):
        bx.text(i, bottom[i], f"{bottom[i]:.1f} µs\n{len(ks)} kernels", ha="center", va="bottom",
                fontsize=8)
    bx.set_xticks(range(len(names)))
    bx.set_xticklabels(names, fontsize=8, rotation=15)
    bx.set(ylabel="estimated time (µs); one segment per kernel", ylim=(0, 1.25 * max(bottom)),
           title="estimated time per step")
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)
