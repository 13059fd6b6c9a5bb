"""Experiment results as data: tables, checked claims, and plain-text rendering.

Every experiment module has ``run(**overrides) -> Result`` (computes, never prints),
``check(result) -> list[Check]`` (the lecture's claims, tested on the returned data) and
``main()`` (prints). The CLI's ``run --json`` prints :meth:`Result.to_json`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from mlsys_jax.errors import MlsysError


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


def fmt(x: Any) -> str:
    """Render a cell: floats with 4 significant digits (scientific when tiny/huge)."""
    if isinstance(x, bool) or x is None:  # ✓/✗ are kept for checked claims (format_result)
        return "" if x is None else ("yes" if x else "no")
    if isinstance(x, (np.generic,)):
        x = x.item()
    if isinstance(x, float):
        if x == 0:
            return "0"
        if not math.isfinite(x):
            return str(x)
        ax = abs(x)
        if ax < 1e-3 or ax >= 1e6:
            return f"{x:.2e}"
        return f"{x:.4g}"
    return str(x)


def format_table(rows: list[dict], title: str | None = None) -> str:
    """Plain-text table of row dicts (columns in first-seen order)."""
    if not rows:
        return f"{title}\n  (empty)" if title else "(empty)"
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    cells = [[fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    line = lambda vals: "  " + " | ".join(v.ljust(w) for v, w in zip(vals, widths))
    out = [title] if title else []
    out += [line(cols), "  " + "-+-".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    return "\n".join(out)


def format_result(result: Result, checks: Iterable[Check] = ()) -> str:
    """The whole printed report of one experiment: tables, notes, then checked claims."""
    parts = [f"== {result.id} · {result.title} =="]
    for name, rows in result.tables.items():
        parts.append(format_table(rows, title=f"\n[{name}]"))
    if result.notes:
        parts.append("\nNotes:\n" + "\n".join(f"  - {n}" for n in result.notes))
    checks = list(checks)
    if checks:
        rows = [{"claim": c.claim, "ours": c.ours, "lecture": c.lecture, "ok": "✓" if c.ok else "✗"}
                for c in checks]
        parts.append(format_table(rows, title="\n[checks]"))
    return "\n".join(parts)
