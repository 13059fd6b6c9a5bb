"""The arrays a factory hands over, each named and sorted into *parameters* or *state*.

``inspect`` counts the two apart, as the libraries do, because a model's size in parameters is
what it learns, not what it carries: BatchNorm's running statistics are state. State is

- flax linen: every collection beside ``params`` in a variables dict (``batch_stats``);
- flax nnx: every ``nnx.Variable`` that is not an ``nnx.Param`` (``nnx.BatchStat``);
- equinox: an ``eqx.nn.State``, wherever it is among the arguments;
- Keras: the non-trainable variables (``model.non_trainable_variables``).

Everything else of the first argument (the parameters, JAX's ``f(params, batch)`` habit) is a
parameter. Keras factories hand over ``[v.value for v in model.variables]``, whose pytree paths
are bare list indices (``[0][8]``): their arrays are named by the Keras variable's ``path``
(``dense/kernel``), found through the function's closure, and placed in that layer's module.
"""
from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass

PARAM, STATE = "param", "state"
_FLAX_PARAMS = "params"  # flax linen's collection of trainable parameters


@dataclass(frozen=True)
class Variable:
    """One traced array of the arguments that belongs to the model."""

    index: int     # its position among the traced leaves of all arguments (the jaxpr's inputs)
    name: str      # the Keras variable's path, or the pytree path (``['params']['Dense_0']...``)
    module: tuple  # the module its name places it in (``provenance.leaf_module``'s rule)
    kind: str      # PARAM or STATE
    leaf: object


def describe(fn, args: tuple) -> list[Variable]:
    """The model's arrays among ``args``: every traced leaf of ``args[0]``, and the leaves of an
    equinox ``State`` in any argument, in the order the jaxpr takes them as inputs."""
    import jax

    from mlsys_jax.ir import is_traced_leaf

    keras_vars = _keras_variables(fn)
    marked = jax.tree_util.tree_flatten_with_path(tuple(args), is_leaf=_is_marker)[0]
    out, index = [], 0
    for path, node in marked:
        marker = node if _is_marker(node) else None
        inner = (jax.tree_util.tree_flatten_with_path(node)[0] if marker is not None
                 else [((), node)])
        for sub, leaf in inner:
            if not is_traced_leaf(leaf, scalars=False):
                continue
            kind = _kind(marker, sub, leaf, keras_vars)
            if kind is not None and (path[0].idx == 0 or _is_eqx_state(marker)):
                out.append(_variable(index, path + tuple(sub), leaf, kind, keras_vars))
            index += 1
    return out


def _variable(index: int, path: tuple, leaf, kind: str, keras_vars: dict) -> Variable:
    import jax

    from mlsys_jax.ir.provenance import leaf_module

    var = keras_vars.get(id(leaf))
    if var is not None:
        name = var.path
        return Variable(index, name, tuple(name.split("/")[:-1]), kind, leaf)
    name = jax.tree_util.keystr(path[1:] if path[0].idx == 0 else path)
    return Variable(index, name.removesuffix(".value"), leaf_module(path[1:]), kind, leaf)


def _kind(marker, sub: tuple, leaf, keras_vars: dict) -> str | None:
    """PARAM or STATE for a leaf under ``marker`` (None: a leaf outside the model)."""
    var = keras_vars.get(id(leaf))
    if var is not None:
        return PARAM if var.trainable else STATE
    if marker is None:
        return PARAM
    if _is_eqx_state(marker):
        return STATE
    if isinstance(marker, Mapping):  # flax linen's variables: collection name first
        first = getattr(sub[0], "key", None) if sub else None
        return PARAM if first == _FLAX_PARAMS else STATE
    nnx = sys.modules.get("flax.nnx")
    return PARAM if nnx is not None and isinstance(marker, nnx.Param) else STATE


def _is_marker(x) -> bool:
    """A node whose leaves share a kind: a flax variables dict, an nnx Variable, an eqx State."""
    if isinstance(x, Mapping):
        return _FLAX_PARAMS in x and len(x) > 1
    nnx = sys.modules.get("flax.nnx")
    return (nnx is not None and isinstance(x, nnx.Variable)) or _is_eqx_state(x)


def _is_eqx_state(x) -> bool:
    eqx = sys.modules.get("equinox")
    return eqx is not None and isinstance(x, eqx.nn.State)


def _keras_variables(fn, depth: int = 3) -> dict:
    """``id(array) -> keras.Variable`` for the Keras layers ``fn`` reaches (its closure, a bound
    method's object, a partial's function and arguments), when Keras is loaded."""
    keras = sys.modules.get("keras")
    layer = getattr(keras, "Layer", None)
    if layer is None:
        return {}
    out: dict = {}
    for obj in _reachable(fn, depth):
        if isinstance(obj, layer):
            out.update((id(v.value), v) for v in obj.variables)
    return out


def _reachable(obj, depth: int, seen: set | None = None):
    """``obj`` and what its closure cells, ``__self__``, ``__wrapped__``, ``func`` and ``args``
    hold, ``depth`` steps deep."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    yield obj
    if depth == 0:
        return
    inner = [c.cell_contents for c in getattr(obj, "__closure__", None) or ()
             if _has_contents(c)]
    inner += [getattr(obj, a) for a in ("__self__", "__wrapped__", "func") if hasattr(obj, a)]
    inner += list(getattr(obj, "args", ()) or ()) if callable(obj) else []
    for x in inner:
        yield from _reachable(x, depth - 1, seen)


def _has_contents(cell) -> bool:
    try:
        return cell.cell_contents is not cell  # always true: reading it is the test
    except ValueError:  # an empty cell
        return False


def graph_variables(user, closed, constant_params: bool = False) -> tuple[dict, dict]:
    """``(weights, kinds)`` of a traced factory: jaxpr Var → module of each array of the first
    argument (what :mod:`mlsys_jax.ir.provenance` reads), and jaxpr Var → :class:`Variable` of
    every array of the model (state in any argument too). With ``constant_params`` the first
    argument's arrays are the jaxpr's constants (found by identity) and the others its inputs."""
    if not (user.examples and user.args):
        return {}, {}
    found = describe(user.fn, user.args)
    n_first = _traced_count(user.args[0])
    kinds = {}
    if constant_params:
        kinds.update(_constants(closed, [v for v in found if v.index < n_first]))
        invars = closed.jaxpr.invars
        kinds.update((invars[v.index - n_first], v) for v in found
                     if v.index >= n_first and v.index - n_first < len(invars))
    else:
        invars = closed.jaxpr.invars
        kinds.update((invars[v.index], v) for v in found if v.index < len(invars))
    weights = {var: v.module for var, v in kinds.items() if v.index < n_first}
    return weights, kinds


def _traced_count(tree) -> int:
    from mlsys_jax.ir import partition

    return len(partition(tree, scalars=False)[0])


def _constants(closed, first: list[Variable]) -> dict:
    """Constvar → Variable for the constants that are the first argument's arrays."""
    import numpy as np

    out = {}
    for var, c in zip(closed.jaxpr.constvars, closed.consts):
        for v in first:
            if c is v.leaf or (isinstance(c, np.ndarray) and isinstance(v.leaf, np.ndarray)
                               and np.may_share_memory(c, v.leaf)):
                out[var] = v
                break
    return out
