"""Experiment results as data: tables, checked claims, and their plain-text rendering.

Every experiment module has ``run(**overrides) -> Result`` (computes, never prints) and
``check(result) -> list[Check]`` (the lecture's claims, tested on the returned data);
``experiments.run_and_print`` prints them with :func:`format_result`, or :meth:`Result.to_json`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from mlsys_jax.errors import MlsysError
from mlsys_jax.tables import format_table, wrap


@dataclass(frozen=True)
class Check:
    """One lecture claim, tested on computed data: ``ours`` is what we measured."""

    claim: str
    ok: bool
    ours: Any = None
    lecture: Any = None
    note: str = ""  # why ours differs from the lecture's figure in value but not in kind

    def to_dict(self) -> dict:
        out = {"claim": self.claim, "ok": bool(self.ok), "ours": to_jsonable(self.ours),
               "lecture": to_jsonable(self.lecture)}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class Result:
    """What an experiment computed: named tables (lists of row dicts), notes, and raw data."""

    id: str
    title: str
    tables: dict[str, list[dict]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self, checks: Iterable[Check] = ()) -> dict:
        return {"id": self.id, "title": self.title,
                "tables": {k: [to_jsonable(r) for r in v] for k, v in self.tables.items()},
                "checks": [c.to_dict() for c in checks],
                "notes": list(self.notes)}


class OverrideError(MlsysError):
    """A ``--set KEY=VALUE`` that the experiment does not accept."""


def resolve_overrides(experiment: str, defaults: Mapping[str, Any],
                      overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``overrides`` into ``defaults``; unknown keys and uncoercible values are errors.

    Values given as strings (from the CLI) are coerced to the default's type.
    """
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise OverrideError(
            f"experiment {experiment}: unknown setting(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(defaults)) or '(none)'}")
    out = dict(defaults)
    for key, value in overrides.items():
        out[key] = _coerce(experiment, key, value, defaults[key])
    return out


def _coerce(experiment: str, key: str, value: Any, default: Any) -> Any:
    if not isinstance(value, str) or isinstance(default, str) or default is None:
        return value
    try:
        if isinstance(default, bool):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if isinstance(default, int):
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, (tuple, list)):
            items = [s for s in value.replace(" ", "").split(",") if s]
            kind = type(default[0]) if default else str
            return type(default)(kind(s) for s in items)
    except ValueError:
        raise OverrideError(
            f"experiment {experiment}: setting {key}={value!r} is not a valid "
            f"{type(default).__name__} (default {default!r})") from None
    return value


def to_jsonable(x: Any) -> Any:
    """Convert numpy/JAX scalars and arrays, dataclasses and tuples into JSON-ready values."""
    if isinstance(x, (str, bool)) or x is None:
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x))
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        arr = np.asarray(x)
        return to_jsonable(arr.item() if arr.ndim == 0 else arr.tolist())
    if isinstance(x, np.generic):
        return to_jsonable(x.item())
    return str(x)


def format_result(result: Result, checks: Iterable[Check] = ()) -> str:
    """The whole printed report of one experiment: tables, notes, then checked claims."""
    parts = [wrap(f"== {result.id} · {result.title} ==", first="")]
    for name, rows in result.tables.items():
        parts.append(format_table(rows, title=f"\n[{name}]"))
    if result.notes:
        parts.append("\nNotes:\n" + "\n".join(wrap(n, first="  - ") for n in result.notes))
    checks = list(checks)
    if checks:
        rows = [{"claim": c.claim, "ours": c.ours, "lecture": c.lecture, "ok": "✓" if c.ok else "✗"}
                for c in checks]
        parts.append(format_table(rows, title="\n[checks]"))
    return "\n".join(parts)
