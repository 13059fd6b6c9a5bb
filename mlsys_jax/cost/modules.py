"""Costs per module of the user's model: the summary ``inspect`` prints first, the way flax's
``Module.tabulate``, Keras' ``model.summary()``, torchinfo and fvcore's ``flop_count_table``
answer "which layer costs what".

Every kernel of both estimates (one kernel per op, fused) belongs to one module: the innermost
module holding all of its equations (:mod:`mlsys_jax.ir.provenance`). A fused loop that spans a
BatchNorm and the relu after it belongs to the block holding both; one that spans two blocks, to
the model. Every parameter belongs to the innermost module holding the equations that read it (a
tied embedding read by ``wte`` and ``wte.attend`` is ``wte``'s), and so does every array of state
(BatchNorm's running statistics), counted apart from the parameters. So a module's figures are
those of its own kernels and parameters plus its children's, a parent's own share is a ``(self)``
row beside its children, and the rows of any level sum to the totals exactly.

A module's input and output shapes come from the dataflow between kernels (one per op): its
inputs are the values its kernels read that no kernel of it wrote (its parameters and state
aside), its outputs the values its kernels wrote that a kernel outside it reads or that nothing
reads (the program's results) — what flax's ``tabulate`` shows, found without running a module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlsys_jax.compat import Var, name_stack_text
from mlsys_jax.ir.provenance import Module, common, origins, owner
from mlsys_jax.ir.trace import aval_bytes, shape_str

UNUSED = "(unused parameters)"


@dataclass
class ModuleCost:
    """Figures of a module (its own and its children's): parameters, FLOPs, bytes and roofline
    time of both estimates, and how its time divides between compute- and memory-bound kernels."""

    path: Module
    params: int = 0
    param_bytes: int = 0
    state: int = 0        # elements of state arrays (running statistics), not parameters
    state_bytes: int = 0
    flops: int = 0
    unfused_bytes: int = 0
    fused_bytes: int = 0
    unfused_us: float = 0.0
    fused_us: float = 0.0
    kernels: int = 0
    fused_kernels: int = 0
    compute_us: float = 0.0  # of the default estimate, launch overhead aside
    memory_us: float = 0.0
    first: float = math.inf  # position of its first kernel: rows in program order
    children: dict = field(default_factory=dict)  # name -> ModuleCost
    own: "ModuleCost | None" = None  # what is its own, beside its children's
    group: bool = False  # a group of a flat namespace's names (``conv2_*``), not a module
    inputs: tuple = ()   # shapes of the values entering it (``f32[1,224,224,3]``), in use order
    outputs: tuple = ()  # shapes of the values leaving it, in program order

    def add(self, other: "ModuleCost") -> None:
        """Fold another row's costs and parameters into this one (a parent sums its children)."""
        for name in ("params", "param_bytes", "state", "state_bytes", "flops", "unfused_bytes",
                     "fused_bytes", "unfused_us", "fused_us", "kernels", "fused_kernels",
                     "compute_us", "memory_us"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.first = min(self.first, other.first)

    @property
    def bound(self) -> tuple[str, float]:
        """The regime most of its roofline time is spent in, and that share."""
        total = self.compute_us + self.memory_us
        if not total:
            return "", 0.0
        return max(("compute", self.compute_us / total), ("memory", self.memory_us / total),
                   key=lambda t: t[1])


def _key(eqn) -> tuple:
    """The same equation of the user's program in two views of it (``open_calls`` renames
    variables each time, but keeps each equation's params, traceback and name stack)."""
    return id(eqn.params), id(eqn.source_info.traceback), name_stack_text(eqn.source_info)


def module_costs(unfused, fused, weights: dict, default_fused: bool,
                 state: frozenset = frozenset()) -> tuple[ModuleCost, dict]:
    """The tree of :class:`ModuleCost` of one graph from its two cost reports (one kernel per
    op, fused; ``cost.estimate``) and its parameters (``weights``: jaxpr Var → module of the
    parameter's pytree path, see :func:`mlsys_jax.ir.provenance.leaf_module`), and the module
    of each kernel (``{"unfused": [...], "fused": [...]}``, in the reports' order). ``state``:
    the Vars that are state (in ``weights`` or not), counted apart from the parameters."""
    eqns = [e for k in unfused.kernels for op in k.ops for e in op.eqns]
    found = origins(eqns, weights)
    grouped = _grouping([o.module for o in found])
    modules = [grouped(o.module) for o in found]
    module_of: dict = {}
    for e, m in zip(eqns, modules):
        module_of.setdefault(_key(e), []).append(m)
    module_of = {k: common(v) for k, v in module_of.items()}
    root = ModuleCost(())
    default = fused if default_fused else unfused
    placed: dict = {"unfused": [], "fused": []}
    for report, is_fused in ((unfused, False), (fused, True)):
        hw = report.hardware
        for pos, k in enumerate(report.kernels):
            path = common(module_of[_key(e)] for op in k.ops for e in op.eqns)
            placed["fused" if is_fused else "unfused"].append(path)
            node = _node(root, path)
            if is_fused:
                node.fused_bytes += k.bytes
                node.fused_us += k.time_us
                node.fused_kernels += 1
            else:
                node.flops += k.flops
                node.unfused_bytes += k.bytes
                node.unfused_us += k.time_us
                node.kernels += 1
                node.first = min(node.first, pos)
            if report is default:
                compute, memory = k.flops / hw.peak(k.dtype), k.bytes / hw.bandwidth
                if compute > memory:
                    node.compute_us += compute * 1e6
                else:
                    node.memory_us += memory * 1e6
    _parameters(root, eqns, modules, weights, state)
    _total(root)
    _dataflow(root, unfused.kernels, placed["unfused"], set(weights) | set(state))
    return root, placed


def _node(root: ModuleCost, path: Module) -> ModuleCost:
    node = root
    for i, name in enumerate(path):
        node = node.children.setdefault(name, ModuleCost(path[:i + 1], group=_is_group(name)))
    return node


def _parameters(root: ModuleCost, eqns: list, modules: list, weights: dict,
                state: frozenset) -> None:
    model = {**dict.fromkeys(weights), **dict.fromkeys(state)}
    readers: dict = {}
    for e, m in zip(eqns, modules):
        for v in e.invars:
            if isinstance(v, Var) and v in model:
                readers.setdefault(v, []).append(owner(m))
    for v in model:
        node = _node(root, common(readers[v]) if v in readers else (UNUSED,))
        if v in state:
            node.state += math.prod(v.aval.shape)
            node.state_bytes += aval_bytes(v.aval)
        else:
            node.params += math.prod(v.aval.shape)
            node.param_bytes += aval_bytes(v.aval)


def _dataflow(root: ModuleCost, kernels: list, paths: list, model: set) -> None:
    """Fill each module's ``inputs`` and ``outputs`` from the values between the kernels of one
    kernel per op (``paths``: each kernel's module): a value written in module ``p`` and read in
    ``c`` leaves every module on ``p``'s side below their common one and enters every module on
    ``c``'s side; a value no kernel writes (an argument) enters every module reading it, and one
    no kernel reads (a result) leaves every module holding its writer. ``model``: the parameters
    and state, which are a module's own, not its inputs."""
    writer, read, ins, outs = {}, set(), {}, {}
    for k, path in zip(kernels, paths):
        for v in k.inputs:
            read.add(v)
            if v in model:
                continue
            pp = writer.get(v)
            shared = len(common([pp, path])) if pp is not None else -1
            for depth in range(shared + 1, len(path) + 1):
                ins.setdefault(path[:depth], {})[v] = None
            if pp is not None:
                for depth in range(shared + 1, len(pp) + 1):
                    outs.setdefault(pp[:depth], {})[v] = None
        for v in k.outputs:
            writer[v] = path
    order = {v: i for i, v in enumerate(writer)}
    for v, pp in writer.items():
        if v not in read:
            for depth in range(len(pp) + 1):
                outs.setdefault(pp[:depth], {})[v] = None
    for path, values in ins.items():
        _node(root, path).inputs = tuple(shape_str(v.aval) for v in values)
    for path, values in outs.items():
        ordered = sorted(values, key=order.__getitem__)
        _node(root, path).outputs = tuple(shape_str(v.aval) for v in ordered)


def _total(node: ModuleCost) -> None:
    """Turn each node's own figures into its subtree's, keeping the own ones in ``own``."""
    if not node.children:
        return
    own = ModuleCost(node.path + ("(self)",))
    own.add(node)
    own.first = node.first
    for child in node.children.values():
        _total(child)
        node.add(child)
    if own.kernels or own.fused_kernels or own.params or own.state:
        node.own = own


# ---- the table: which rows, at which depth ----------------------------------------------------

MAX_ROWS = 40  # the default depth is the deepest whose table has at most this many rows


@dataclass(frozen=True)
class Row:
    """A row of the module table: its name at its level (``attn``, ``(self)``, ``conv2_*``),
    its depth (1 = top), its figures, and whether rows of the table are shown below it."""

    name: str
    depth: int
    cost: ModuleCost
    expanded: bool


def top(root: ModuleCost) -> tuple[Module, ModuleCost]:
    """The table's top: the model itself when everything belongs to one module (flax's and
    haiku's root, ``GPT2``), else the whole program. Flat namespaces (Keras' 176 layers of
    ``conv2_block1_1_conv`` ...) are grouped by their names' ``_``-separated prefixes."""
    node = root
    if len(root.children) == 1 and root.own is None:
        only = next(iter(root.children.values()))
        node = only if only.children else root
    return node.path, node


def listing(node: ModuleCost) -> list[tuple[str, ModuleCost]]:
    """The rows under ``node``: its children in program order, then its ``(self)`` row."""
    out = sorted(node.children.items(), key=lambda kv: kv[1].first)
    return out + ([("(self)", node.own)] if node.own is not None else [])


def rows(node: ModuleCost, depth: int, level: int = 1) -> list[Row]:
    """The table of ``node``'s subtree down to ``depth`` levels (rows at any level are its
    children's, so the rows not expanded sum to ``node``)."""
    out = []
    for name, child in listing(node):
        expand = level < depth and bool(child.children)
        out.append(Row(name, level, child, expand))
        if expand:
            out += rows(child, depth, level + 1)
    return out


def depth_of(node: ModuleCost) -> int:
    """Levels of rows below ``node``."""
    return max((1 + depth_of(c) for c in node.children.values()), default=0)


def default_depth(node: ModuleCost, max_rows: int = MAX_ROWS) -> int:
    """The deepest level whose table has at most ``max_rows`` rows (at least 1)."""
    best = 1
    for d in range(2, depth_of(node) + 1):
        if len(rows(node, d)) > max_rows:
            break
        best = d
    return best


GROUP = "_*"  # a group of names is named by its members' common prefix and this


def _is_group(name: str) -> bool:
    return name.endswith(GROUP)


def _grouping(paths: list):
    """A function inserting groups into module paths, for every module with more than
    MAX_ROWS children (a flat namespace like Keras' layers): its children are grouped by their
    names' ``_``-separated prefixes (``conv2_*`` › ``conv2_block1_*`` › ``conv2_block1_1_*``),
    so the kernels of one block fall in one group, fused loops across its layers too."""
    children: dict = {}
    for p in paths:
        for i in range(len(p)):
            children.setdefault(p[:i], {}).setdefault(p[i])
    maps = {}
    for parent, names in children.items():
        if len(names) > MAX_ROWS:
            labels: dict = {}
            top_level = _groups(list(names), 0, (), labels)
            if top_level < len(names):
                maps[parent] = labels

    def grouped(path: Module) -> Module:
        if not maps:
            return path
        out: list = []
        for i, name in enumerate(path):
            out += maps.get(path[:i], {}).get(name, ())
            out.append(name)
        return tuple(out)
    return grouped


def _groups(names: list, k: int, above: tuple, labels: dict) -> int:
    """Record in ``labels`` (name → group labels above it) the groups of ``names``, which share
    their first ``k`` ``_``-tokens: by the next token, a group of one being its member, each
    group named by its members' longest common prefix. Returns how many entries result."""
    buckets: dict = {}
    for name in names:
        tokens = name.split("_")
        buckets.setdefault(tokens[k] if len(tokens) > k else None, []).append(name)
    entries = 0
    for token, members in buckets.items():
        if token is None or len(members) == 1:
            labels.update((m, above) for m in members)
            entries += len(members)
            continue
        split = [m.split("_") for m in members]
        n = k + 1
        while all(len(t) > n for t in split) and len({t[n] for t in split}) == 1:
            n += 1
        _groups(members, n, above + ("_".join(split[0][:n]) + GROUP,), labels)
        entries += 1
    return entries
