"""Graphviz DOT export of a jaxpr: equations as nodes, values as edges, nested bodies as clusters."""
from __future__ import annotations

from mlsys_jax.compat import ClosedJaxpr, Literal
from mlsys_jax.ir.opview import op_name
from mlsys_jax.ir.trace import shape_str
from mlsys_jax.ir.walk import bodies


def _esc(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def to_dot(closed, name: str = "jaxpr") -> str:
    """DOT text for a jaxpr; calls and control flow appear as clusters holding their bodies."""
    lines = [f'digraph "{_esc(name)}" {{', "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    counter = [0]

    def fresh(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}{counter[0]}"

    def emit(jaxpr, indent: str, producers: dict) -> None:
        for v in list(jaxpr.constvars) + list(jaxpr.invars):
            if v not in producers:
                nid = fresh("in")
                producers[v] = nid
                lines.append(f'{indent}{nid} [label="{_esc(str(v))}: {_esc(shape_str(v.aval))}", shape=ellipse];')
        for eqn in jaxpr.eqns:
            nid = fresh("e")
            label = f"{op_name(eqn)}\\n" + ", ".join(shape_str(v.aval) for v in eqn.outvars)
            lines.append(f'{indent}{nid} [label="{_esc(label)}"];')
            for v in eqn.invars:
                if not isinstance(v, Literal) and v in producers:
                    lines.append(f"{indent}{producers[v]} -> {nid};")
            for body in bodies(eqn):
                cid = fresh("cluster_")
                lines.append(f'{indent}subgraph {cid} {{ label="{_esc(body.label)}"; style=dashed;')
                emit(body.jaxpr, indent + "  ", {})
                lines.append(f"{indent}}}")
            for v in eqn.outvars:
                producers[v] = nid
        out = fresh("out")
        lines.append(f'{indent}{out} [label="outputs", shape=ellipse];')
        for v in jaxpr.outvars:
            if not isinstance(v, Literal) and v in producers:
                lines.append(f"{indent}{producers[v]} -> {out};")

    emit(closed.jaxpr if isinstance(closed, ClosedJaxpr) else closed, "  ", {})
    lines.append("}")
    return "\n".join(lines)
