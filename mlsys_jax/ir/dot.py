"""Graphviz DOT export of a jaxpr (``inspect --dot``): equations as nodes, values as edges, one
``subgraph cluster_...`` per module of the user's model, nested bodies of control flow as dashed
clusters.

Plain calls (a jitted model) are opened, so their equations sit in the modules that traced them
(:mod:`mlsys_jax.ir.provenance`, the modules ``inspect``'s table reads); a call with a custom
derivative (``relu``) is one node, named as the op view names it. A label is the op's name and
its outputs' shapes on a second line (a real DOT line break); inputs are named ``in0``,
``const0`` ... with their shape. Past :data:`COLLAPSE_OVER` nodes (a ResNet-50 has
thousands of equations) each module becomes one node counting its equations, at the deepest
level of the module tree that keeps the graph within the limit.

>>> import jax.numpy as jnp
>>> from mlsys_jax.ir.trace import trace
>>> print(to_dot(trace(lambda x: jnp.sin(x) * 2.0, "f32[3]"), "f"))  # doctest: +ELLIPSIS
digraph "f" {
...
  in1 [label="in0\\nf32[3]", shape=ellipse];
...
"""
from __future__ import annotations

from mlsys_jax.compat import ClosedJaxpr, Literal
from mlsys_jax.ir.opview import op_name, open_calls
from mlsys_jax.ir.primitives import CUSTOM_DERIVATIVE_CALLS, PLAIN_CALLS
from mlsys_jax.ir.provenance import origins
from mlsys_jax.ir.trace import shape_str
from mlsys_jax.ir.walk import bodies

COLLAPSE_OVER = 300  # nodes: a larger graph shows one node per module
HEAD = ("  rankdir=TB;", '  node [shape=box, fontname="monospace"];',
        '  graph [fontname="monospace"];')


def _esc(s: str) -> str:
    """The text of a DOT quoted string (backslashes and quotes escaped)."""
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _graph_id(name: str) -> str:
    """The graph's quoted name: an ID keeps backslashes as written (only an escaped quote is an
    escape there), so a backslash, which could escape the closing quote, becomes ``/``."""
    return '"' + name.replace("\\", "/").replace('"', '\\"') + '"'


def label(*lines: str) -> str:
    """A quoted DOT label of ``lines``, joined by DOT's line break ``\\n`` (escaped per line, so
    the break is not itself escaped into text)."""
    return '"' + "\\n".join(_esc(line) for line in lines) + '"'


class _Ids:
    """Node ids (``e1``, ``in2`` ...) and per-kind counters for the names shown (``in0``)."""

    def __init__(self):
        self.n, self.kinds = 0, {}

    def node(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def shown(self, kind: str) -> str:
        k = self.kinds.get(kind, 0)
        self.kinds[kind] = k + 1
        return f"{kind}{k}"


def to_dot(closed, name: str = "jaxpr", *, weights: dict | None = None,
           collapse_over: int = COLLAPSE_OVER) -> str:
    """DOT text for a jaxpr. ``weights`` (input Var -> module of the parameter, as ``inspect``
    builds it) helps place equations of models without name scopes; past ``collapse_over``
    nodes the graph has one node per module."""
    jaxpr = closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed
    view = open_calls(jaxpr, lambda e: e.primitive.name in PLAIN_CALLS)
    modules = [o.module for o in origins(list(view.eqns), weights or {})]
    inputs = list(jaxpr.constvars) + list(jaxpr.invars)
    size = len(inputs) + sum(_count(e) for e in view.eqns)
    lines = [f"digraph {_graph_id(name)} {{", *HEAD]
    if size > collapse_over:
        lines += _collapsed(jaxpr, view, modules, collapse_over, weights or {})
    else:
        lines += _full(jaxpr, view, modules)
    lines.append("}")
    return "\n".join(lines)


def _drawn(eqn) -> list:
    """The bodies drawn inside an equation's node: control flow's and checkpoint's, not the
    body of an op with a custom derivative (``relu`` is one op)."""
    return [] if eqn.primitive.name in CUSTOM_DERIVATIVE_CALLS else bodies(eqn)


def _count(eqn) -> int:
    """Nodes of one equation: itself and its drawn bodies' equations, inputs and outputs."""
    return 1 + sum(len(b.jaxpr.invars) + 1 + sum(_count(e) for e in b.jaxpr.eqns)
                   for b in _drawn(eqn))


def _inputs(jaxpr, ids: _Ids, producers: dict, lines: list, indent: str,
            kinds: tuple = ("const", "in")) -> None:
    """Input nodes named by kind and counter: ``in0``, ``const0``; a body's ``arg0`` ..."""
    shown = ids.shown if kinds[1] == "in" else _Ids().shown  # a body counts its own arguments
    for kind, vs in zip(kinds, (jaxpr.constvars, jaxpr.invars)):
        for v in vs:
            if v not in producers:
                producers[v] = nid = ids.node("in")
                lines.append(f"{indent}{nid} [label={label(shown(kind), shape_str(v.aval))}, "
                             "shape=ellipse];")


def _outputs(outvars, ids: _Ids, producers: dict, lines: list, edges: list, indent: str) -> None:
    out = ids.node("out")
    lines.append(f'{indent}{out} [label="outputs", shape=ellipse];')
    edges += [f"{producers[v]} -> {out};" for v in outvars
              if not isinstance(v, Literal) and v in producers]


def _eqn(eqn, ids: _Ids, producers: dict, lines: list, edges: list, indent: str) -> None:
    """An equation's node and its bodies' clusters (in ``lines``), its input edges (in
    ``edges``: written at the top level, since a node an edge first names inside a cluster is
    drawn in that cluster)."""
    nid = ids.node("e")
    lines.append(f"{indent}{nid} [label="
                 f"{label(op_name(eqn), ', '.join(shape_str(v.aval) for v in eqn.outvars))}];")
    edges += [f"{producers[v]} -> {nid};" for v in eqn.invars
              if not isinstance(v, Literal) and v in producers]
    for body in _drawn(eqn):
        lines.append(f"{indent}subgraph {ids.node('cluster_body')} {{ label={label(body.label)}; "
                     "style=dashed;")
        inner: dict = {}
        _inputs(body.jaxpr, ids, inner, lines, indent + "  ", ("const", "arg"))
        for e in body.jaxpr.eqns:
            _eqn(e, ids, inner, lines, edges, indent + "  ")
        _outputs(body.jaxpr.outvars, ids, inner, lines, edges, indent + "  ")
        lines.append(f"{indent}}}")
    for v in eqn.outvars:
        producers[v] = nid


def _full(jaxpr, view, modules: list) -> list[str]:
    """Every equation a node, inside the cluster of its module."""
    ids, producers, lines, edges = _Ids(), {}, [], []
    _inputs(jaxpr, ids, producers, lines, "  ")
    placed: dict = {}  # module -> its equations' DOT lines
    for eqn, module in zip(view.eqns, modules):
        _eqn(eqn, ids, producers, placed.setdefault(tuple(module), []), edges, "")
    lines += _clusters(placed, ids)
    _outputs(view.outvars, ids, producers, lines, edges, "  ")
    return lines + ["  " + e for e in edges]


def _clusters(placed: dict, ids: _Ids) -> list[str]:
    """Nested ``subgraph cluster_...`` blocks, one per module (and per module above one),
    holding the lines placed in each."""
    tree: dict = {}
    for module in placed:
        for i in range(len(module) + 1):
            tree.setdefault(module[:i], set())
            if i:
                tree[module[:i - 1]].add(module[:i])

    def emit(module: tuple, indent: str) -> list[str]:
        out = [indent + line for line in placed.get(module, [])]
        for child in sorted(tree[module], key=_first_of(placed)):
            out += [f"{indent}subgraph {ids.node('cluster_m')} {{ label={label(child[-1])};",
                    *emit(child, indent + "  "), f"{indent}}}"]
        return out
    return emit((), "  ")


def _first_of(placed: dict):
    """Sort key: modules in the order they first hold an equation (program order)."""
    order = {m: i for i, m in enumerate(placed)}
    return lambda m: min((i for p, i in order.items() if p[:len(m)] == m), default=len(order))


def _collapsed(jaxpr, view, modules: list, limit: int, weights: dict) -> list[str]:
    """One node per module (at the deepest depth keeping the graph within ``limit`` nodes):
    its equation count and the parameter arrays it reads; edges where a value flows between
    modules; inputs (the parameters' edges left out: they would tie every module to one node)
    and outputs one node each."""
    depth = _depth(modules, limit - 2)
    cut = [tuple(m)[:depth] for m in modules]
    counts: dict = {}
    params: dict = {}
    for eqn, m in zip(view.eqns, cut):
        counts[m] = counts.get(m, 0) + _equations(eqn)
        params.setdefault(m, set()).update(v for v in eqn.invars
                                           if not isinstance(v, Literal) and v in weights)
    ids = _Ids()
    node = {m: ids.node("m") for m in counts}
    inputs = list(jaxpr.constvars) + list(jaxpr.invars)
    n_params = sum(v in weights for v in inputs)
    read = [f"{n_params} parameters: edges left out"] if n_params else []
    lines = [f"  inputs [label={label('inputs', f'{len(inputs)} values', *read)}, shape=ellipse];",
             '  outputs [label="outputs", shape=ellipse];']
    placed: dict = {}
    parents = {m[:i] for m in counts for i in range(len(m))}
    for m, n in counts.items():
        where, own = (m, "(self)") if m in parents and m else (m[:-1], m[-1] if m else "(top)")
        arrays = len(params[m])
        reads = [f"{arrays} parameter{'s' * (arrays != 1)}"] if arrays else []
        placed.setdefault(where, []).append(
            f"{node[m]} [label={label(own, f'{n:,} equation' + 's' * (n != 1), *reads)}];")
    lines += _clusters(placed, ids)
    producers = {v: "inputs" for v in inputs if v not in weights}
    return lines + [f"  {a} -> {b};" for a, b in _module_edges(view, cut, node, producers)]


def _module_edges(view, cut: list, node: dict, producers: dict) -> list[tuple]:
    """(from, to) node pairs, once each, where a value flows between two nodes."""
    edges: dict = {}
    for eqn, m in zip(view.eqns, cut):
        for v in eqn.invars:
            src = None if isinstance(v, Literal) else producers.get(v)
            if src and src != node[m]:
                edges[(src, node[m])] = None
        producers.update((v, node[m]) for v in eqn.outvars)
    edges.update(((producers[v], "outputs"), None) for v in view.outvars
                 if not isinstance(v, Literal) and v in producers)
    return list(edges)


def _equations(eqn) -> int:
    """An equation and every equation of its bodies."""
    return 1 + sum(_equations(e) for b in bodies(eqn) for e in b.jaxpr.eqns)


def _depth(modules: list, limit: int) -> int:
    """The deepest module level whose distinct modules number at most ``limit`` (at least 1)."""
    deepest = max((len(m) for m in modules), default=1)
    best = 1
    for d in range(2, deepest + 1):
        if len({tuple(m)[:d] for m in modules}) > limit:
            break
        best = d
    return best
