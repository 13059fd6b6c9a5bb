"""A layout as data: what ``plan --emit`` writes, ``shard --layout`` reads, and a user's own
``jax.jit(..., in_shardings=...)`` can take.

    {"mesh": {"data": 8, "model": 8}, "zero": 3, "remat": "as written",
     "rules": [["\\\\['params'\\\\]\\\\['embed'\\\\]\\\\['embedding'\\\\]$", ["model", "data"]], ...]}

``rules`` give, by parameter path (``jax.tree_util.keystr``, as a regex), the PartitionSpec the
step keeps each parameter in — the tensor-parallel split with ZeRO's data axis added where its
stage splits parameters (ZeRO-3) — one list entry per dimension: an axis name, a list of axis
names, or null. ``shard --layout`` takes the tensor-parallel part (the data axis removed: the
ZeRO stage's row adds it again) and checks that its own layout then holds every parameter as the
file says. A pipelined layout adds ``"pipeline": {"stages", "microbatches", "schedule"}``.
"""
from __future__ import annotations

import json
import re

from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import DATA, MODEL, PIPE
from mlsys_jax.parallel.stages import STAGE_NUMBERS

KEYS = ("mesh", "zero", "rules")
AXES = (DATA, MODEL, PIPE)


def _entry(e):
    return list(e) if isinstance(e, tuple) else e


def to_data(*, mesh: dict, zero: int, param_specs: dict, remat: str, pipeline=None) -> dict:
    """The layout file's object from a layout's per-parameter specs (path -> PartitionSpec)."""
    out = {"mesh": {k: int(v) for k, v in mesh.items() if int(v) > 1 or k == DATA},
           "zero": int(zero), "remat": remat,
           "rules": [[re.escape(path) + "$", [_entry(e) for e in spec]]
                     for path, spec in param_specs.items()]}
    if pipeline:
        out["pipeline"] = pipeline
    return out


def write(path: str, data: dict) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def read(path: str) -> dict:
    """The layout file at ``path``, checked: one line naming what is wrong."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise MlsysError(f"--layout {path}: cannot read it ({e.strerror})") from None
    except json.JSONDecodeError as e:
        raise MlsysError(f"--layout {path}: not JSON ({e.msg} at line {e.lineno}); write it "
                         "with mlsys-jax plan --emit") from None
    if not isinstance(data, dict) or any(k not in data for k in KEYS):
        raise MlsysError(f"--layout {path}: a layout needs the keys {', '.join(KEYS)} "
                         "(mlsys-jax plan --emit writes one)")
    mesh = data["mesh"]
    if not isinstance(mesh, dict) or not mesh or any(
            k not in AXES or not isinstance(v, int) or v < 1 for k, v in mesh.items()):
        raise MlsysError(f"--layout {path}: mesh must map axes of {', '.join(AXES)} to "
                         f"positive sizes, got {mesh!r}")
    if data["zero"] not in STAGE_NUMBERS:
        raise MlsysError(f"--layout {path}: zero must be one of {STAGE_NUMBERS}, got "
                         f"{data['zero']!r}")
    for rule in data["rules"]:
        if not (isinstance(rule, list) and len(rule) == 2 and isinstance(rule[0], str)
                and isinstance(rule[1], list)):
            raise MlsysError(f"--layout {path}: each rule is [PATH_REGEX, [AXIS_OR_NULL, ...]], "
                             f"got {rule!r}")
        try:
            re.compile(rule[0])
        except re.error as e:
            raise MlsysError(f"--layout {path}: rule {rule[0]!r} is not a regex ({e})") from None
    return data


def spec_of(entries: list) -> P:
    return P(*[tuple(e) if isinstance(e, list) else e for e in entries])


def without_data(spec: P) -> P:
    """The tensor-parallel part of a kept spec: the data axis (ZeRO's) removed."""
    out = []
    for e in spec:
        if isinstance(e, (tuple, list)):
            kept = tuple(a for a in e if a != DATA)
            out.append(kept[0] if len(kept) == 1 else (kept or None))
        else:
            out.append(None if e == DATA else e)
    return P(*out)


def tp_rules(data: dict) -> list:
    """``(regex, PartitionSpec)`` pairs for ``shard``: the rules' tensor-parallel parts."""
    return [(rx, without_data(spec_of(entries))) for rx, entries in data["rules"]]


def check_held(data: dict, params_specs: dict, path: str) -> None:
    """Every parameter is kept as the file says (``params_specs``: path -> the layout's spec)."""
    for p, spec in params_specs.items():
        want = next((spec_of(e) for rx, e in data["rules"] if re.search(rx, p)), None)
        if want is None:
            raise MlsysError(f"--layout {path}: no rule matches the parameter {p}; the layout "
                             "was made for another model (plan it for this one)")
        if tuple(_norm(want)) != tuple(_norm(spec)):
            raise MlsysError(f"--layout {path}: {p} would be kept as {spec}, the file says "
                             f"{want}: the layout was made for other shapes or another mesh")


def _norm(spec):
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return entries
