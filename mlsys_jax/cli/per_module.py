"""``optimize``'s report per module of the user's model: each module's estimated time and kernels
before and after, and the rewrites and refusals that happened in it (``BottleneckBlock_3: 3
fold_conv_bn``). Rewrites keep the module of what they replace (``compat.traced_as``), so the
graph after optimization has the same modules as the one before."""
from __future__ import annotations

from collections import Counter

from mlsys_jax.ir.provenance import Module

ELSEWHERE = "(elsewhere)"  # a rewrite outside every row of the table


class Inputs:
    """An ``observe`` hook for ``passes.run``/``passes.search``: remembers the input graph of
    each rewrite and refusal (their ``where`` paths are paths of that graph)."""

    def __init__(self):
        self.graph_of: dict = {}

    def __call__(self, name, graph, result) -> None:
        for r in (*result.rewrites, *result.refusals):
            self.graph_of[id(r)] = graph


def locator(graph, weights: dict):
    """``module(where)``: the module of the equation at path ``where`` of ``graph`` (for a path
    inside a body we do not open, or of a body, the innermost module of what is inside)."""
    from mlsys_jax.ir.opview import open_calls
    from mlsys_jax.ir.provenance import common, origins

    view = open_calls(graph, lambda e: True)
    by_path = dict(zip(view.paths, (o.module for o in origins(list(view.eqns), weights))))

    def module(where: str) -> Module:
        parts = where.split("/")
        while parts:
            key = "/".join(parts)
            if key in by_path:
                return by_path[key]
            inside = [m for p, m in by_path.items() if p.startswith(key + "/")]
            if inside:
                return common(inside)
            parts.pop()
        return ()
    return module


def modules_of(entries, inputs: Inputs, default_graph, weights_of) -> list[Module]:
    """The module of each rewrite or refusal: located in the graph it was found in (recorded by
    ``inputs``), or else in ``default_graph``; ``weights_of(graph)`` maps its parameters."""
    located: dict = {}
    out = []
    for r in entries:
        graph = inputs.graph_of.get(id(r), default_graph)
        if id(graph) not in located:
            located[id(graph)] = locator(graph, weights_of(graph))
        out.append(located[id(graph)](r.where))
    return out


def _index(node, out: dict) -> dict:
    out[node.path] = node
    if node.own is not None:
        out[node.own.path] = node.own
    for child in node.children.values():
        _index(child, out)
    return out


def compare(before, after, rewrites: list, refusals: list) -> list[dict]:
    """The rows of the before graph's module table (``cli.summary.ModuleSummary``) with the
    same modules' figures after, and the rules that fired and refused in each (``rewrites`` and
    ``refusals``: ``(rule, module)`` pairs); rewrites outside every row come last, as
    :data:`ELSEWHERE`."""
    rows = before.table()
    later = _index(after.node, {})
    counts = [(Counter(), Counter()) for _ in rows] + [(Counter(), Counter())]
    for k, entries in enumerate((rewrites, refusals)):
        for rule, m in entries:
            i = _row_of(rows, m)
            counts[len(rows) if i is None else i][k][rule] += 1
    fused = before.default_fused
    out = []
    for r, (fired, refused) in zip(rows, counts):
        now = later.get(r.cost.path)
        out.append({"name": r.name, "depth": r.depth, "path": list(r.cost.path),
                    "before_us": _time(r.cost, fused), "after_us": _time(now, fused),
                    "kernels_before": _kernels(r.cost, fused), "kernels_after": _kernels(now, fused),
                    "rewrites": dict(fired.most_common()), "refusals": dict(refused.most_common())})
    fired, refused = counts[-1]
    if fired or refused:
        out.append({"name": ELSEWHERE, "depth": 1, "path": [], "rewrites": dict(fired),
                    "refusals": dict(refused)})
    return out


def text_rows(rows: list[dict], *, by_rule: bool = True) -> list[dict]:
    """:func:`compare`'s rows as the terminal shows them: each module's rewrites and refusals
    by rule (``3 fold_constants, 1 fold_conv_bn``), or (``by_rule=False``) counted only, which
    fits 80 columns beside the times when the rules are listed in tables of their own."""
    from mlsys_jax.cli.summary import figure

    def counts(c: dict) -> str:
        if not by_rule:
            n = sum(c.values())
            return str(n) if n else ""
        return ", ".join(f"{n} {rule}" for rule, n in c.items())
    return [{"module": "  " * (r["depth"] - 1) + r["name"],
             "µs before": figure(r["before_us"]) if "before_us" in r else "",
             "µs after": figure(r["after_us"]) if "after_us" in r else "",
             "kernels": f"{r['kernels_before']} → {r['kernels_after']}" if "kernels_before" in r
             else "", "rewrites": counts(r["rewrites"]), "refused": counts(r["refusals"])}
            for r in rows]


def _time(node, fused: bool) -> float:
    return 0.0 if node is None else node.fused_us if fused else node.unfused_us


def _kernels(node, fused: bool) -> int:
    return 0 if node is None else node.fused_kernels if fused else node.kernels


def _row_of(rows, m: Module):
    """The table row a module belongs to: the deepest row holding it (a row shown with rows
    below it holds only what none of them does: its ``(self)`` row, if it has one)."""
    best = None
    for i, r in enumerate(rows):
        path = r.cost.path
        if r.name != "(self)" and m[:len(path)] == path and (
                best is None or len(path) > len(rows[best].cost.path)):
            best = i
    if best is not None and rows[best].expanded:
        own = rows[best].cost.path + ("(self)",)
        return next((i for i in range(best + 1, len(rows)) if rows[i].cost.path == own), best)
    return best
