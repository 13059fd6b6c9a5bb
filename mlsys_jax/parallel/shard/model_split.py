"""Which parameters the model axis splits, and why each other one stays whole.

The user's own word comes first: explicit ``(regex, PartitionSpec)`` rules, else the model's
sharding annotations (flax's logical axis names, resolved by logical axis rules given as the
factory's 5th item or ``--axis-rules``). Without either, Megatron's splits are derived from the
loss's dataflow (``tensor_split.derive``). Every parameter left whole is listed with the reason;
when nothing at all is split the report says so and names the fix.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from jax.sharding import PartitionSpec as P

from mlsys_jax.parallel.shard import annotations, tensor_split
from mlsys_jax.parallel.shard.partition_rules import apply_rules, array_paths


@dataclass(frozen=True)
class ModelSplit:
    """The tensor-parallel layout of the parameters over the ``model`` axis."""

    source: str                 # "rules", "annotations", "derived" or "none" (no model axis)
    specs: dict                 # keystr path -> PartitionSpec, every trainable array
    rules: tuple                # (pattern, spec text) pairs as the report shows them
    replicated: dict            # path -> why it is not split over model
    groups: tuple = ()          # derived Megatron groups (column, row, bias paths)
    megatron: int | None = None  # Megatron's forward all-reduces for the derived groups
    notes: tuple = ()

    @property
    def split(self) -> list:
        return [p for p, s in self.specs.items() if any(e is not None for e in s)]


def _model_axis(spec) -> bool:
    return any(e == "model" or (isinstance(e, tuple) and "model" in e) for e in spec)


def decide(params, trainable, closed, rules, axis_rules, mesh) -> ModelSplit:
    """The split for ``trainable`` (``params`` with static leaves removed; ``closed``: the loss
    traced on it) on ``mesh``."""
    m = int(mesh.shape["model"]) if "model" in mesh.axis_names else 1
    paths = [p for p, _ in array_paths(trainable)]
    whole = {p: P() for p in paths}
    logical = axis_rules if axis_rules is not None else (
        rules if annotations.is_logical_rules(rules) else None)
    if rules is not None and logical is None:
        placed = apply_rules(trainable, list(rules), mesh)
        replicated = {p: ("matches no rule" if p in placed.unmatched else
                          f"its rule {placed.rule_of[p]!r} leaves it whole")
                      for p in paths if not _model_axis(placed.specs[p])}
        return ModelSplit("rules", placed.specs, tuple((rx, str(s)) for rx, s in rules),
                          replicated)
    names = annotations.read(params)
    notes = []
    if names:
        mesh_names = all(n is None or n in annotations.MODEL_AXES or n == "data"
                         for ns in names.values() for n in ns)
        if logical is not None or mesh_names:
            specs, notes = annotations.specs(names, logical or [], tuple(mesh.axis_names))
            checked = apply_rules(trainable, [(re.escape(p) + "$", s) for p, s in specs.items()],
                                  mesh)
            replicated = {p: (f"its logical axes {names[p]} map to no model axis" if p in names
                              else "carries no sharding annotation")
                          for p in paths if not _model_axis(checked.specs[p])}
            shown = tuple((n, str(a)) for n, a in (logical or []))
            return ModelSplit("annotations", {**whole, **checked.specs}, shown, replicated,
                              notes=tuple(notes))
        some = sorted({n for ns in names.values() for n in ns if n})
        notes.append(f"the parameters carry logical axis names ({', '.join(some)}) but no "
                     "logical axis rules were given: give them as the factory's 5th item or "
                     "--axis-rules NAME=AXIS,...; the split below is derived from the dataflow")
    if m <= 1:
        return ModelSplit("none", whole, (), {}, notes=tuple(notes))
    found = tensor_split.derive(closed, dict(zip(closed.jaxpr.invars[:len(paths)], paths)), m)
    rules_shown = tuple((re.escape(p) + "$", str(s)) for p, s in found.specs.items())
    return ModelSplit("derived", {**whole, **found.specs}, rules_shown, found.replicated,
                      found.groups, found.row_matmuls, tuple(notes))
