"""``inspect``'s per-module summary: the module table (text and ``--json``), built from both
estimates of a graph and the user's parameters (:mod:`mlsys_jax.cost.modules`)."""
from __future__ import annotations

from dataclasses import dataclass

from mlsys_jax.cost.modules import Row, default_depth, depth_of, module_costs, rows, top


@dataclass(frozen=True)
class ModuleSummary:
    """The module tree of one graph and the depth its table shows."""

    root: tuple          # the model's own name when everything is inside it (("GPT2",)), or ()
    node: object         # cost.modules.ModuleCost at the top of the table
    placed: dict         # the module of each kernel: {"unfused": [...], "fused": [...]}
    depth: int           # the table's depth (--depth, or the deepest that fits MAX_ROWS rows)
    levels: int          # how deep the tree goes
    default_fused: bool  # which estimate the "share", "bytes" and "bound" columns read

    def table(self) -> list[Row]:
        return rows(self.node, self.depth)

    def leaves(self) -> list[Row]:
        """The rows not expanded in the table: they sum to the totals."""
        return [r for r in self.table() if not r.expanded]


def weights_of(user, closed, constant_params: bool = False) -> dict:
    """jaxpr Var → module of each parameter array of a factory (``user.parameters()``): the
    graph's first inputs, or with ``constant_params`` its constants that are those arrays."""
    import numpy as np

    from mlsys_jax.ir.provenance import leaf_module

    params = user.parameters()
    if not constant_params:
        return {v: leaf_module(path) for v, (path, _) in zip(closed.jaxpr.invars, params)}
    out = {}
    for v, c in zip(closed.jaxpr.constvars, closed.consts):
        for path, leaf in params:
            if c is leaf or (isinstance(c, np.ndarray) and isinstance(leaf, np.ndarray)
                             and np.may_share_memory(c, leaf)):
                out[v] = leaf_module(path)
                break
    return out


def summarize(both, weights: dict, depth: int | None = None) -> ModuleSummary:
    """The module summary of a graph costed both ways (``headline.Estimates``)."""
    from mlsys_jax.errors import MlsysError

    fused_default = both.default is both.fused
    tree, placed = module_costs(both.unfused, both.fused, weights, fused_default)
    root, node = top(tree)
    levels = max(depth_of(node), 1)
    if depth is not None and depth < 1:
        raise MlsysError(f"--depth must be a positive integer (levels of modules), got {depth}")
    chosen = default_depth(node) if depth is None else min(depth, levels)
    return ModuleSummary(root, node, placed, chosen, levels, fused_default)


def _count(n: int) -> str:
    for size, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def figure(x: float) -> str:
    """Three significant digits (two below 0.01)."""
    if x == 0:
        return "0"
    if abs(x) < 0.01:
        return f"{x:.2g}"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _unit(total: float, name: str) -> tuple[float, str]:
    """The unit (``GFLOP``, ``MB``...) in which the table's total reads as at least 1."""
    for size, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if total >= size:
            return size, prefix + name
    return 1.0, name


def text_rows(summary: ModuleSummary) -> list[dict]:
    """The table as the terminal shows it (indented names, rounded figures)."""
    node, fused = summary.node, summary.default_fused
    total = _time(node, fused)
    flop_unit, flop_name = _unit(node.flops, "FLOP")
    byte_unit, byte_name = _unit(node.fused_bytes if fused else node.unfused_bytes, "B")
    param_unit, param_name = _unit(node.param_bytes, "B")
    out = []
    for r in summary.table():
        c = r.cost
        moved = c.fused_bytes if fused else c.unfused_bytes
        regime, share = c.bound
        out.append({
            "module": "  " * (r.depth - 1) + r.name,
            "params": _count(c.params) if c.params else "",
            f"param {param_name}": figure(c.param_bytes / param_unit) if c.params else "",
            flop_name: figure(c.flops / flop_unit),
            f"{byte_name} moved": figure(moved / byte_unit),
            "µs unfused": figure(c.unfused_us),
            "µs fused": figure(c.fused_us),
            "share": f"{100 * _time(c, fused) / total:.1f}%" if total else "",
            "bound": regime if share >= 0.995 or not regime else f"{regime} {100 * share:.0f}%",
        })
    return out


def _time(c, fused: bool) -> float:
    return c.fused_us if fused else c.unfused_us


def json_rows(summary: ModuleSummary) -> list[dict]:
    """Every node of the tree at every depth (a parent's figures include its children's; a
    ``(self)`` row holds what is its own), for ``--json``."""
    total = _time(summary.node, summary.default_fused)
    out = []

    def visit(node, level: int) -> None:
        from mlsys_jax.cost.modules import listing

        for name, c in listing(node):
            regime, share = c.bound
            moved = c.fused_bytes if summary.default_fused else c.unfused_bytes
            out.append({"name": name, "path": list(c.path),
                        "depth": level, "kind": "self" if name == "(self)" else
                        "group" if c.group else "module",
                        "params": c.params, "param_bytes": c.param_bytes, "flops": c.flops,
                        "bytes": moved, "unfused_bytes": c.unfused_bytes,
                        "fused_bytes": c.fused_bytes, "unfused_us": c.unfused_us,
                        "fused_us": c.fused_us, "kernels": c.kernels,
                        "fused_kernels": c.fused_kernels,
                        "share": _time(c, summary.default_fused) / total if total else 0.0,
                        "intensity": c.flops / moved if moved else None,
                        "bound": regime, "bound_share": share})
            if name != "(self)":
                visit(c, level + 1)
    visit(summary.node, 1)
    return out
