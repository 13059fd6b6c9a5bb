"""What a plan's saved and recomputed values are called when a person reads them.

The planner names a value by its primitive and equation (``div_7``, ``LossGraph.names``): unique
and stable, which ``--json`` and the plans' keys need, but it says nothing of where the value is
in the model. For the text report each value is named by the module that computed it and its
primitive, ``Block_0/attn/div`` (``ir.provenance``: flax's and haiku's module names, equinox's
parameter paths, ``jax.named_scope``, else the user's line), the model's own name left out when
every value is inside it; where one module computes several values with the same primitive they
are told apart by order, ``Block_0/attn/mul#2``.
"""
from __future__ import annotations

from collections import Counter

import jax


def _weights(graph, params) -> dict:
    """jaxpr Var → module of each differentiated parameter (``flat.flatten_loss``'s order:
    the array leaves of ``params``); a flax variables dict's collection name (``params``) is not
    a module."""
    from collections.abc import Mapping

    from mlsys_jax.ir.provenance import leaf_module
    from mlsys_jax.remat.planner.flat import _is_array

    paths = [path for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
             if _is_array(leaf)]
    if isinstance(params, Mapping) and "params" in params:
        paths = [p[1:] for p in paths]
    invars = graph.closed.jaxpr.invars[:graph.n_diff]
    return {v: leaf_module(p) for v, p in zip(invars, paths)} if len(paths) == len(invars) \
        else {}


def _modules(found: list) -> list:
    """Each equation's module as the label shows it: the model's own name (``Transformer``),
    which its name stack puts before every module, left out; a line of the user's source kept
    (``model.py:27``), none where there is no line."""
    from mlsys_jax.ir.provenance import UNNAMED, common

    named = [o.module for o in found if o.how == "name"]  # parameter paths start below it
    root = common(named) if named else ()
    if any(len(m) == len(root) for m in named):
        root = ()
    out = []
    for o in found:
        m = o.module
        if o.how == "line":
            out.append(() if m == (UNNAMED,) else m)
        else:
            out.append(m[len(root):] if root and m[:len(root)] == root else m)
    return out


def value_names(graph, params) -> dict:
    """``LossGraph.names`` → ``module/primitive`` (``#k`` where a module computes several values
    with one primitive; ``.j``: the j-th output of an equation with several)."""
    from mlsys_jax.ir.provenance import origins

    eqns = list(graph.closed.jaxpr.eqns)
    modules = _modules(origins(eqns, _weights(graph, params)))
    labels = []
    for name, i in zip(graph.names, graph.eqn_of):
        several = name[name.rindex("."):] if "." in name.rpartition("_")[2] else ""
        labels.append("/".join((*modules[i], eqns[i].primitive.name)) + several)
    counts, seen = Counter(labels), Counter()
    out = {}
    for name, label in zip(graph.names, labels):
        seen[label] += 1
        out[name] = f"{label}#{seen[label]}" if counts[label] > 1 else label
    return out


def label_of(labels: dict, name: str) -> str:
    """``name`` as :func:`value_names` labels it; a value the plan derives from one
    (``tanh_19.jvp``, the JVP intermediates of ``tanh_19``) keeps its suffix; else ``name``."""
    if name in labels:
        return labels[name]
    base, dot, suffix = name.rpartition(".")
    return labels[base] + dot + suffix if dot and base in labels else name
