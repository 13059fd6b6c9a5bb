"""The user's own sharding annotations: flax's logical axis names, mapped to this mesh.

flax linen code annotates parameters where it creates them — ``nn.with_logical_partitioning(init,
('embed', 'mlp'))`` boxes the value in ``nn.LogicallyPartitioned`` (``nn.Partitioned`` for mesh
axis names) — and maps logical names to mesh axes with *logical axis rules* (the t5x/maxtext
convention, flax's ``examples/lm1b``: ``[('mlp', 'tensor'), ('vocab', 'tensor'), ('embed',
'fsdp')]``). flax nnx keeps the names in a variable's ``out_sharding`` (older: ``sharding``)
metadata. :func:`read` collects the names per parameter path; :func:`specs` resolves them with
flax's own ``nn.logical_to_mesh_axes`` and maps the rules' mesh axes onto this mesh: ``model``
(``tensor`` in the lm1b convention) is the tensor-parallel axis; ``fsdp`` — parameters split
over the data axis — is what ``--zero 3`` does here, so it is left to ZeRO and said so.

The boxes stay where the model put them: the model runs as shipped, and the arrays inside are
what is sharded (their paths end in ``.value``).
"""
from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
# the rules' mesh axes read as this mesh's (MODEL_AXES: 'tensor' is model) or left to ZeRO-3
from mlsys_jax.parallel.axes import DATA, MODEL, MODEL_AXES, ZERO_AXES


def _axis_metadata():
    try:
        from flax.core import meta
    except ImportError:
        return None
    return meta.AxisMetadata


def _nnx_variable():
    try:
        from flax import nnx
    except ImportError:
        return None
    return nnx.Variable


def read(params) -> dict:
    """``{keystr path of the array: logical names}`` for every annotated parameter."""
    box, var = _axis_metadata(), _nnx_variable()
    if box is None and var is None:
        return {}
    kinds = tuple(k for k in (box, var) if k is not None)
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(
            params, is_leaf=lambda x: isinstance(x, kinds))[0]:
        names = None
        if box is not None and isinstance(leaf, box):
            names = getattr(leaf, "names", None)
        elif var is not None and isinstance(leaf, var):
            meta = leaf.get_metadata() if hasattr(leaf, "get_metadata") else {}
            names = meta.get("out_sharding") or meta.get("sharding") or meta.get("sharding_names")
        if names:
            inner = jax.tree_util.tree_flatten_with_path(leaf)[0]
            for sub, _ in inner:
                out[jax.tree_util.keystr(tuple(path) + tuple(sub))] = tuple(names)
    return out


def is_logical_rules(rules) -> bool:
    """Logical axis rules — ``[(logical name, mesh axis | None | (axes...)), ...]`` — as opposed
    to partition rules ``[(regex, PartitionSpec), ...]``."""
    if not isinstance(rules, (list, tuple)) or not rules:
        return False
    return all(isinstance(r, (list, tuple)) and len(r) == 2 and isinstance(r[0], str)
               and (r[1] is None or isinstance(r[1], str)
                    or (isinstance(r[1], (tuple, list)) and all(isinstance(a, str) for a in r[1])))
               for r in rules)


def parse_axis_rules(text: str) -> list:
    """``--axis-rules mlp=model,vocab=model,embed=`` -> ``[('mlp', 'model'), ..., ('embed', None)]``."""
    out = []
    for part in text.split(","):
        name, sep, axis = part.strip().partition("=")
        if not sep or not name.strip():
            raise MlsysError(f"--axis-rules: expected LOGICAL=AXIS pairs (an empty AXIS leaves it "
                             f"whole), e.g. mlp=model,embed= ; got {text!r}")
        out.append((name.strip(), axis.strip() or None))
    return out


def specs(names: dict, rules, mesh_axes: tuple) -> tuple[dict, list]:
    """``({path: PartitionSpec over this mesh}, notes)`` from logical names and rules."""
    import flax.linen as nn

    notes, zeroed, out = [], set(), {}
    for path, logical in names.items():
        try:
            spec = nn.logical_to_mesh_axes(logical, rules)
        except Exception as e:  # flax's own check of the rules
            raise MlsysError(f"logical axis rules: flax cannot map {logical} of {path}: "
                             f"{type(e).__name__}: {e}") from None
        mapped = []
        for entry in spec:
            axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
            keep = []
            for a in axes:
                if a in MODEL_AXES and MODEL in mesh_axes:
                    keep.append(MODEL_AXES[a])
                elif a in ZERO_AXES or (a in MODEL_AXES and MODEL not in mesh_axes):
                    zeroed.add(a)
                elif a == DATA:
                    raise MlsysError(f"logical axis rules put {path} on the data axis; splitting "
                                     "parameters over data is ZeRO here: map that name to fsdp "
                                     "or none, and use --zero 3")
                else:
                    raise MlsysError(f"logical axis rules map {logical} of {path} to mesh axis "
                                     f"{a!r}, which this mesh lacks (axes: {', '.join(mesh_axes)};"
                                     f" 'tensor' is read as model, 'fsdp' as ZeRO-3); change the "
                                     "rules or give --axis-rules")
            mapped.append(keep[0] if len(keep) == 1 else tuple(keep) or None)
        out[path] = P(*mapped)
    for a in sorted(zeroed):
        notes.append(f"the rules' mesh axis {a!r} is not part of this mesh: "
                     + ("parameters split over the batch axis are ZeRO-3 here (--zero 3)"
                        if a in ZERO_AXES else "add model=M to --mesh to split over it"))
    return out, notes
