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
    """jaxpr Var → module of each parameter array of a factory (its first argument's arrays,
    a Keras array by its variable's path: ``cli.variables``): the graph's first inputs, or with
    ``constant_params`` its constants that are those arrays."""
    from mlsys_jax.cli.variables import graph_variables

    return graph_variables(user, closed, constant_params)[0]


def summarize(both, weights: dict, depth: int | None = None,
              state: frozenset = frozenset()) -> ModuleSummary:
    """The module summary of a graph costed both ways (``headline.Estimates``); ``state``: the
    Vars of the model's state (``cli.variables``), counted apart from its parameters."""
    from mlsys_jax.errors import MlsysError

    fused_default = both.default is both.fused
    tree, placed = module_costs(both.unfused, both.fused, weights, fused_default, state)
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
    """The table as the terminal shows it (indented names, rounded figures, each module's first
    input and output shape), every column; :func:`fit_table` leaves out what does not fit."""
    node, fused = summary.node, summary.default_fused
    total = _time(node, fused)
    flop_unit, flop_name = _unit(node.flops, "FLOP")
    byte_unit, byte_name = _unit(node.fused_bytes if fused else node.unfused_bytes, "B")
    param_unit, param_name = _unit(node.param_bytes, "B")
    table = summary.table()
    plain = _common_dtype([s for r in table for s in r.cost.inputs[:1] + r.cost.outputs[:1]])
    suffix = f" ({plain})" if plain else ""
    out = []
    for r in table:
        c = r.cost
        moved = c.fused_bytes if fused else c.unfused_bytes
        regime, share = c.bound
        row = {"module": "  " * (r.depth - 1) + r.name,
               "params": _count(c.params) if c.params else ""}
        if node.state:
            row["state"] = _count(c.state) if c.state else ""
        row.update({
            f"param {param_name}": figure(c.param_bytes / param_unit) if c.params else "",
            flop_name: figure(c.flops / flop_unit),
            f"{byte_name} moved": figure(moved / byte_unit),
            "µs unfused": figure(c.unfused_us),
            "µs fused": figure(c.fused_us),
            "share": f"{100 * _time(c, fused) / total:.1f}%" if total else "",
            "bound": regime if share >= 0.995 or not regime else f"{regime} {100 * share:.0f}%",
            f"in{suffix}": _shapes(c.inputs, plain),
            f"out{suffix}": _shapes(c.outputs, plain),
        })
        out.append(row)
    return out


def fit_table(rows: list[dict], title: str, fused: bool,
              width: int | None = None) -> tuple[str, list[str]]:
    """The table at ``width`` columns (the terminal's) in one block of one line a row, leaving
    out optional columns, least useful first (:data:`LEFT_OUT_FIRST`), until it fits; returns
    the text and the columns left out (columns empty in every row are left out unsaid)."""
    from mlsys_jax.tables import format_table, terminal_width

    width = terminal_width() if width is None else width
    empty = [k for k in (rows[0] if rows else {}) if not any(r[k] for r in rows)]
    rows = [{k: v for k, v in r.items() if k not in empty} for r in rows]  # nothing to show
    order = [k for key in LEFT_OUT_FIRST for k in (rows[0] if rows else {})
             if _column_key(k, fused) == key]
    left_out: list[str] = []
    while True:
        kept = [{k: v for k, v in r.items() if k not in left_out} for r in rows]
        text = format_table(kept, title=title, width=width)
        body = text.split("\n")[title.count("\n") + 1:]
        if (len(body) <= len(rows) + 3 and "" not in body) or len(left_out) == len(order):
            return text, left_out
        left_out.append(order[len(left_out)])


# the table's optional columns, the first left out first when it is wider than the terminal
LEFT_OUT_FIRST = ("in", "param bytes", "other µs", "moved", "state", "bound", "out")


def _column_key(name: str, fused: bool) -> str:
    """The :data:`LEFT_OUT_FIRST` key of a column of :func:`text_rows`, or ''."""
    other = "µs unfused" if fused else "µs fused"
    for key, test in (("in", name.startswith("in")), ("out", name.startswith("out")),
                      ("param bytes", name.startswith("param ")), ("other µs", name == other),
                      ("moved", name.endswith(" moved")), ("state", name == "state"),
                      ("bound", name == "bound")):
        if test:
            return key
    return ""


def _common_dtype(shapes: list[str]) -> str:
    """The dtype most shapes have (``f32``), which the table's shape columns leave out."""
    from collections import Counter

    dtypes = Counter(s.split("[", 1)[0] for s in shapes if "[" in s)
    return dtypes.most_common(1)[0][0] if dtypes else ""


def _shapes(shapes: tuple, plain: str) -> str:
    """The first shape, its dtype left out when it is ``plain``, and how many more follow."""
    if not shapes:
        return ""
    first = shapes[0].removeprefix(plain) if shapes[0].startswith(plain + "[") else shapes[0]
    return first + (f"+{len(shapes) - 1}" if len(shapes) > 1 else "")


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
                        "params": c.params, "param_bytes": c.param_bytes,
                        "state": c.state, "state_bytes": c.state_bytes,
                        "inputs": list(c.inputs), "outputs": list(c.outputs), "flops": c.flops,
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
