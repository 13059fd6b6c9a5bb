"""Where a user's forward can be cut: its modules, in order, found in the traced loss.

A *unit* is a run of top-level equations of the loss's jaxpr that one module computes; stages are
contiguous runs of units. Two sources name them:

* **name stacks** — flax linen and haiku push each module's name onto every equation it emits
  (``Transformer/Block_3/Dense_0``, ``mlp/linear_3``), and so does a ``jax.named_scope`` a user
  places as a split marker. They name *instances* only if each name's equations are contiguous;
* **parameter paths** — equinox names classes, not instances (every layer is ``eqx.nn.Linear``),
  so its units are its parameter groups (``layers[3]``: each block of a list is a unit at every
  level), and an equation belongs to the latest
  unit whose parameters reach it through the dataflow (a residual ``x + f(x)`` belongs to
  ``f``'s block). Also used when name stacks repeat (a tied embedding reused by the head).

Either way the level is the coarsest that gives at least as many units as stages. A top-level
``scan`` over stacked parameters (flax ``nn.scan``, ``lax.scan``) whose per-iteration outputs
are unused is one unit per iteration: cutting it slices the stacked parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax

from mlsys_jax.compat import DropVar, Literal, Var
from mlsys_jax.errors import MlsysError


@dataclass(frozen=True)
class StackScan:
    """A top-level scan over stacked parameters: ``stacked`` are the positions (in the
    equation's inputs) of the xs that are parameter leaves, sliced when the stack is cut."""

    eqn: int
    length: int
    name: str
    stacked: tuple[int, ...]


@dataclass(frozen=True)
class Unit:
    """A place between cuts: top-level equations ``eqns``, or iteration ``iteration`` of a stack."""

    name: str
    eqns: tuple[int, ...] = ()
    stack: StackScan | None = None
    iteration: int = 0


@dataclass(frozen=True)
class Units:
    """The units in order; ``unit_of[i]`` is top-level equation i's unit (None: it follows its
    inputs, or computes from the batch and constants alone); ``first[eqn]`` is the index of a
    stack's iteration 0."""

    units: tuple[Unit, ...]
    unit_of: tuple
    first: dict
    source: str
    live: frozenset


def path_components(path) -> list[str]:
    """A parameter's key path as names: dict keys (haiku's ``a/~/b`` split), attributes, ``[i]``."""
    out: list[str] = []
    for k in path:
        if isinstance(k, jax.tree_util.SequenceKey):
            out.append(f"[{k.idx}]")
        elif isinstance(k, jax.tree_util.DictKey) and isinstance(k.key, int):
            out.append(f"[{k.key}]")        # nnx keeps a list's items under int keys
        elif isinstance(k, jax.tree_util.DictKey):
            out += [c for c in str(k.key).split("/~/") if c]
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
        else:
            out.append(str(k).strip(".[]'\""))
    return out


def prefix(components, depth: int) -> tuple:
    """The first ``depth`` names of a path, each with the list indices that follow it: a list of
    blocks is a unit per block at every level (``blocks[3]``, never ``blocks``)."""
    out, levels = [], 0
    for k, c in enumerate(components):
        if _is_level(components, k):
            if levels == depth:
                break
            levels += 1
        out.append(c)
    return tuple(out)


def _is_level(components, k: int) -> bool:
    """A name is a level; an index is one unless it follows a name (``blocks[3]``: one level)."""
    return not components[k].startswith("[") or k == 0 or components[k - 1].startswith("[")


def unit_name(components) -> str:
    """``['layers', '[3]']`` -> ``layers[3]``; ``['Block_3', 'Dense_0']`` -> ``Block_3/Dense_0``."""
    text = ""
    for c in components:
        text += c if c.startswith("[") or not text else "/" + c
    return text or "(top)"


def reads(e) -> list:
    """The variables equation ``e`` reads (literals are not variables, and are unhashable)."""
    return [v for v in e.invars if isinstance(v, Var) and not isinstance(v, Literal)]


def live_equations(jaxpr) -> frozenset:
    """Top-level equations whose results reach the outputs (or that have effects)."""
    needed = {v for v in jaxpr.outvars if isinstance(v, Var)}
    live = set()
    for i in reversed(range(len(jaxpr.eqns))):
        e = jaxpr.eqns[i]
        if e.effects or any(v in needed for v in e.outvars):
            live.add(i)
            needed.update(reads(e))
    return frozenset(live)


def stack_scans(jaxpr, n_params: int, live, names) -> dict[int, StackScan]:
    """Top-level scans over stacked parameter leaves whose ys are unused (cuttable)."""
    params = {v: i for i, v in enumerate(jaxpr.invars[:n_params])}
    used = {v for e in jaxpr.eqns for v in reads(e)} | {
        v for v in jaxpr.outvars if not isinstance(v, Literal)}
    out = {}
    for i, e in enumerate(jaxpr.eqns):
        if i not in live or e.primitive.name != "scan" or e.params["reverse"]:
            continue
        start = e.params["num_consts"] + e.params["num_carry"]
        stacked = tuple(j for j in range(start, len(e.invars))
                        if not isinstance(e.invars[j], Literal) and e.invars[j] in params)
        ys = e.outvars[e.params["num_carry"]:]
        if e.params["length"] < 2 or not stacked or any(
                not isinstance(v, DropVar) and v in used for v in ys):
            continue
        prefix = common_prefix([names[params[e.invars[j]]] for j in stacked])
        out[i] = StackScan(i, int(e.params["length"]), unit_name(prefix) if prefix else "scan",
                           stacked)
    return out


def common_prefix(lists) -> list:
    """The longest prefix every list shares (module paths' common parent)."""
    lists = list(lists)
    if not lists:
        return []
    n = 0
    while all(len(c) > n and c[n] == lists[0][n] for c in lists):
        n += 1
    return list(lists[0][:n])


def find_units(closed, n_params: int, param_paths, stages: int) -> Units:
    """The units of the traced loss ``closed`` (inputs: ``n_params`` parameter leaves, then the
    batch), at the coarsest level with at least ``stages`` of them."""
    jaxpr = closed.jaxpr
    live = live_equations(jaxpr)
    comps = [path_components(p) for p in param_paths]
    pre = len(common_prefix(comps)) if len(comps) > 1 else 0
    if pre and any(len(c) > pre and c[pre].startswith("[") for c in comps):
        pre -= 1  # keep the list's name: layers[3], not [3]
    names = [c[pre:] or c[-1:] for c in comps]
    stacks = stack_scans(jaxpr, n_params, live, names)
    found = _by_name_stack(jaxpr, live, stacks, stages)
    if found is None:
        found = _by_parameters(jaxpr, n_params, names, live, stacks, stages)
    units, unit_of, source = found
    first = {}
    for k, u in enumerate(units):
        if u.stack is not None and u.iteration == 0:
            first[u.stack.eqn] = k
    return Units(tuple(units), tuple(unit_of), first, source, live)


def _expand(order, stacks) -> list[Unit]:
    """Units from an ordered list of ``(name, eqns)`` and stack-equation markers."""
    out = []
    for item in order:
        if isinstance(item, StackScan):
            out += [Unit(f"{item.name}[{i}]", (), item, i) for i in range(item.length)]
        else:
            out.append(Unit(item[0], tuple(item[1])))
    return out


def _by_name_stack(jaxpr, live, stacks, stages):
    stack_of = {i: [c for c in str(e.source_info.name_stack).split("/") if c]
                for i, e in enumerate(jaxpr.eqns) if i in live and i not in stacks}
    named = [c for c in stack_of.values() if c]
    if not named:
        return None
    pre = len(common_prefix(named))
    for depth in range(1, max(len(c) for c in named) - pre + 1):
        key = {i: tuple(c[pre: pre + depth]) or None for i, c in stack_of.items()}
        order, index = [], {}
        for i in sorted(live):
            if i in stacks:
                order.append(stacks[i])
                continue
            k = key[i]
            if k is None:
                continue
            if k in index and index[k] != len(order) - 1:
                return None  # the name comes back after another: a class name, not a module
            if k not in index:
                index[k] = len(order)
                order.append((unit_name(k), []))
            order[index[k]][1].append(i)
        units = _expand(order, stacks)
        if len(units) >= stages or depth == max(len(c) for c in named) - pre:
            slot = {}
            for k, u in enumerate(units):
                for i in u.eqns:
                    slot[i] = k
            return units, [slot.get(i) for i in range(len(jaxpr.eqns))], "name stack"
    return None


def _by_parameters(jaxpr, n_params, names, live, stacks, stages):
    params = {v: i for i, v in enumerate(jaxpr.invars[:n_params])}
    in_stack = {params[jaxpr.eqns[i].invars[j]] for i, s in stacks.items() for j in s.stacked}
    depth_max = max((sum(_is_level(c, k) for k in range(len(c))) for c in names), default=1)
    for depth in range(1, depth_max + 1):
        order, group_slot, slot_of_var, unit_of = [], {}, {}, [None] * len(jaxpr.eqns)
        count = 0
        for i in sorted(live):
            e = jaxpr.eqns[i]
            slots = [slot_of_var[v] for v in reads(e) if v in slot_of_var]
            if i in stacks:
                s = stacks[i]
                order.append(s)
                unit_of[i] = None
                count += s.length
                for v in e.outvars:
                    slot_of_var[v] = count - 1
                continue
            for v in reads(e):
                if v in params and params[v] not in in_stack:
                    g = prefix(names[params[v]], depth)
                    if g not in group_slot:
                        group_slot[g] = count
                        order.append((unit_name(g), []))
                        count += 1
                    slots.append(group_slot[g])
            if not slots:
                continue  # the batch and constants alone: computed wherever it is needed
            unit_of[i] = max(slots)
            for v in e.outvars:
                slot_of_var[v] = unit_of[i]
        units = _expand(order, stacks)
        for i, k in enumerate(unit_of):
            if k is not None and units[k].stack is None:
                units[k] = Unit(units[k].name, units[k].eqns + (i,))
        if len(units) >= stages or depth == depth_max:
            return units, unit_of, "parameter paths"
    raise MlsysError("pipeline: the loss reads no parameters; nothing to split into stages")
