"""Partition rules for tensor parallelism: regular expressions over parameter paths (§5.2).

Large JAX code bases shard a model's parameters by *rules*: an ordered list of
``(regex, PartitionSpec)`` pairs matched against each parameter's path as
``jax.tree_util.keystr`` spells it (``['params']['Block_0']['MlpBlock_0']['Dense_0']['kernel']``
for flax, ``.layers[0].weight`` for equinox). The first rule whose regex ``re.search``-es the path
decides; a parameter no rule matches is replicated, and :func:`apply_rules` says which.

:func:`megatron_rules` derives the rules of Megatron-LM's layout (lecture §5.2) from the usual
names of MLP and attention layers: the first projection of an MLP and the query/key/value
projections are split by output features (column-parallel; attention heads for flax's 3-D
kernels), the second MLP projection and the attention output by input features (row-parallel),
so each pair needs one all-reduce in the forward pass.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

import jax
from jax.sharding import Mesh, PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import MODEL

Rules = Sequence[tuple[str, P]]

# Layer names of the usual libraries (flax, equinox, haiku, Hugging Face ports).
_COLUMN = {"query", "key", "value", "q_proj", "k_proj", "v_proj", "query_proj", "key_proj",
           "value_proj", "wq", "wk", "wv", "qkv", "qkv_proj", "c_attn", "in_proj", "fc1",
           "up_proj", "gate_proj", "w1", "w3", "wi", "wi_0", "wi_1", "c_fc", "fc_in",
           "dense_h_to_4h", "linear1", "lin1"}
_ROW = {"out", "o_proj", "out_proj", "output_proj", "wo", "c_proj", "fc2", "down_proj", "w2",
        "fc_out", "dense_4h_to_h", "linear2", "lin2"}
# Auto-numbered layers (Dense_0, Dense_1 / layers[0], layers[1]) pair up as column, row inside
# a module that is an MLP by name, or at the root of the parameters.
_NUMBERED = re.compile(r"^(?:Dense|DenseGeneral|Linear|dense|linear)_(\d+)$")
_MLP_PARENT = re.compile(r"mlp|ffn|feed_?forward|ffw|^layers$", re.IGNORECASE)
_ROOTS = ((), ("params",))
# Which dimension a role splits, by the weight's name: flax/haiku store (in, out) and flax's
# attention kernels (in, heads, head_dim) / (heads, head_dim, out); equinox and PyTorch-style
# ports store (out, in).
_SPLIT_DIM = {("kernel", "column"): 1, ("kernel", "row"): 0, ("w", "column"): 1,
              ("w", "row"): 0, ("weight", "column"): 0, ("weight", "row"): 1}
_BIASES = ("bias", "b")


@dataclass(frozen=True)
class Placement:
    """Where rules put each parameter: its spec, the rule that matched, and the unmatched ones."""

    specs: dict          # keystr path -> PartitionSpec, for every array leaf
    rule_of: dict        # keystr path -> the regex that matched it
    unmatched: tuple     # paths no rule matched (replicated)


def array_paths(tree) -> list[tuple[str, object]]:
    """``(keystr path, leaf)`` of every array leaf of a pytree (static leaves left out)."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return [(jax.tree_util.keystr(p), x) for p, x in leaves if hasattr(x, "shape")]


def _check_rules(rules) -> list[tuple[str, P, re.Pattern]]:
    example = "e.g. [(r\"mlp.*kernel\", PartitionSpec(None, 'model'))]"
    if isinstance(rules, dict):
        rules = list(rules.items())
    if not isinstance(rules, (list, tuple)):
        raise MlsysError(f"partition rules: expected a list of (regex, PartitionSpec) pairs, got "
                         f"{type(rules).__name__}; {example}")
    out = []
    for rule in rules:
        if not (isinstance(rule, (list, tuple)) and len(rule) == 2 and isinstance(rule[0], str)
                and isinstance(rule[1], P)):
            raise MlsysError(f"partition rules: {rule!r} is not a (regex, PartitionSpec) pair; "
                             f"{example}")
        try:
            out.append((rule[0], rule[1], re.compile(rule[0])))
        except re.error as e:
            raise MlsysError(f"partition rule {rule[0]!r} is not a regular expression ({e}); "
                             "escape brackets as \\[ \\]") from None
    return out


def _spec_axes(spec: P) -> list[tuple[int, tuple[str, ...]]]:
    """(dimension, mesh axes) for every split dimension of a spec."""
    return [(d, (e,) if isinstance(e, str) else tuple(e)) for d, e in enumerate(spec)
            if e is not None]


def apply_rules(tree, rules: Rules, mesh: Mesh) -> Placement:
    """Match every array leaf of ``tree`` against ``rules``; validate each spec on ``mesh``.

    Raises MlsysError naming the rule and the parameter when a spec uses an axis the mesh lacks,
    has more entries than the parameter has dimensions, or splits a dimension the axis size does
    not divide.
    """
    checked = _check_rules(rules)
    specs, rule_of, unmatched = {}, {}, []
    for path, leaf in array_paths(tree):
        hit = next(((rx, spec) for rx, spec, c in checked if c.search(path)), None)
        if hit is None:
            specs[path] = P()
            unmatched.append(path)
            continue
        rx, spec = hit
        shape = tuple(leaf.shape)
        if len(spec) > len(shape):
            raise MlsysError(f"partition rule {rx!r} gives {spec} ({len(spec)} entries) to {path} "
                             f"of shape {shape}; give at most {len(shape)} entries")
        for d, axes in _spec_axes(spec):
            missing = [a for a in axes if a not in mesh.axis_names]
            if missing:
                raise MlsysError(f"partition rule {rx!r} uses axis {missing[0]!r}, which is not in "
                                 f"the mesh (axes: {', '.join(mesh.axis_names)}); add it to "
                                 f"--mesh (e.g. {missing[0]}=2) or change the rule")
            size = 1
            for a in axes:
                size *= int(mesh.shape[a])
            if shape[d] % size:
                raise MlsysError(
                    f"partition rule {rx!r} splits dimension {d} (size {shape[d]}) of {path} over "
                    f"{'x'.join(axes)} of size {size}, which does not divide it; use an axis size "
                    f"that divides {shape[d]}, or a rule that leaves {path} replicated")
        specs[path], rule_of[path] = spec, rx
    return Placement(specs, rule_of, tuple(unmatched))


def _names(path) -> list:
    """Plain names of a key path: dict keys and attribute names as str, sequence indices as int."""
    out = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                out.append(getattr(k, attr))
                break
    return out


def _role(module: list) -> str | None:
    """'column' or 'row' for a layer known by name; None otherwise."""
    name = module[-1] if module else None
    if isinstance(name, str) and name in _COLUMN:
        return "column"
    if isinstance(name, str) and name in _ROW:
        return "row"
    return None


def _numbered_roles(layers: dict) -> dict:
    """Pair auto-numbered sibling layers: (0, 1) -> column, row; (2, 3) -> ...; an odd one out stays."""
    roles = {}
    groups: dict = {}
    for module in layers:
        last = module[-1]
        m = _NUMBERED.match(last) if isinstance(last, str) else None
        index = int(m[1]) if m else last if isinstance(last, int) else None
        parent = module[:-1]
        if index is None or not (parent in _ROOTS or _MLP_PARENT.search(str(parent[-1]))):
            continue
        groups.setdefault(parent, []).append((index, module))
    for members in groups.values():
        members.sort()
        for (_, first), (_, second) in zip(members[0::2], members[1::2]):
            roles[first], roles[second] = "column", "row"
    return roles


def _layer_spec(role: str, leaf_name: str, shape: tuple, axis: str) -> P | None:
    if leaf_name in _BIASES:
        return P(axis) if role == "column" else P()
    dim = _SPLIT_DIM.get((leaf_name, role))
    if dim is None or dim >= len(shape) or len(shape) < 2:
        return None
    return P(*([None] * dim + [axis]))


def _piece(key, general: bool) -> str:
    """The regex for one key of a path; ``general`` turns a layer index into ``\\d+``."""
    text = re.escape(jax.tree_util.keystr((key,)))
    if not general:
        return text
    if isinstance(key, jax.tree_util.SequenceKey):
        return r"\[\d+\]"
    return re.sub(r"_\d+(?=('\\\])?$)", r"_\\d+", text)  # Block_0 -> Block_\d+


def _regexes(path) -> tuple[str, str]:
    """The exact regex of a path, and one with its layer indices generalised (not the last two)."""
    exact = "".join(_piece(k, False) for k in path) + "$"
    general = "".join(_piece(k, i < len(path) - 2) for i, k in enumerate(path)) + "$"
    return exact, general


def _divides(spec: P, shape: tuple, size: int) -> bool:
    return all(shape[d] % size == 0 for d, _ in _spec_axes(spec))


def megatron_rules(params, axis: str = MODEL, size: int | None = None) -> list[tuple[str, P]]:
    """Partition rules for Megatron-style tensor parallelism, derived from ``params``' names.

    Column-parallel (split output features / heads): query/key/value projections and an MLP's
    first projection (``Dense_0``, ``layers[0]``, ``fc1``, ``up_proj`` ...) with their biases;
    row-parallel (split input features / heads, bias replicated): the attention output and an
    MLP's second projection. Norms, embeddings and unpaired layers get no rule (replicated; see
    :func:`apply_rules`). With ``size``, a layer whose split dimension ``size`` does not divide
    is left out (replicated) instead of failing later. Layers of the same kind in every block
    share one rule (``Block_\\d+``). Example::

        rules = megatron_rules(variables)   # [("\\['params'\\]...\\['query'\\]\\['kernel'\\]$", P(None, 'model')), ...]
    """
    layers: dict = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if hasattr(leaf, "shape") and len(path) >= 2:
            layers.setdefault(tuple(_names(path[:-1])), []).append((path, tuple(leaf.shape)))
    numbered = _numbered_roles(layers)
    chosen = []  # (exact regex, general regex, spec), in path order
    for module, members in layers.items():
        role = _role(list(module)) or numbered.get(module)
        if role is None:
            continue
        specs = [(path, _layer_spec(role, str(_names(path[-1:])[0]), shape, axis), shape)
                 for path, shape in members]
        if size and any(s is not None and not _divides(s, shape, size) for _, s, shape in specs):
            continue  # the axis cannot split this layer: leave the whole layer replicated
        chosen += [(*_regexes(path), spec) for path, spec, _ in specs if spec is not None]
    by_general: dict = {}
    for _, general, spec in chosen:
        by_general.setdefault(general, set()).add(spec)
    out, seen = [], set()
    for exact, general, spec in chosen:  # a general rule only where all its layers agree
        rx = general if len(by_general[general]) == 1 else exact
        if rx not in seen:
            seen.add(rx)
            out.append((rx, spec))
    return out
