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
        """The check as JSON data; its note only when there is one."""
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
        """The result and its checks as JSON data (results.json)."""
        return {"id": self.id, "title": self.title,
                "tables": {k: [to_jsonable(r) for r in v] for k, v in self.tables.items()},
                "checks": [c.to_dict() for c in checks],
                "notes": list(self.notes)}


SAME_REL = 0.01  # a figure within 1 % of the lecture's is the same figure
ROUNDING = 1e-9  # figures below this are float rounding noise, whatever their exact value


def mark(check: Check) -> tuple[str, str]:
    """``("✓", "")`` matched, ``("✗", "")`` failed, or ``("≈", why)``: the claim holds but ours
    differs from the lecture's figure, with the check's note or "float rounding noise" as why.

    A lecture entry that is a phrase ("> 1", "one fused kernel") is the criterion itself: a
    check that holds matches it. A lecture *figure* within :data:`SAME_REL` of ours matches.
    """
    if not check.ok:
        return "✗", ""
    lecture = check.lecture
    if lecture is None or isinstance(lecture, str) or _same(check.ours, lecture):
        return "✓", ""
    if check.note:
        return "≈", check.note
    ours, lec = _float(check.ours), _float(lecture)
    if ours is not None and lec is not None and abs(ours) < ROUNDING and abs(lec) < ROUNDING:
        return "≈", "both are float rounding noise"
    return "≈", "no reason recorded"


def _same(ours: Any, lecture: Any) -> bool:
    if isinstance(ours, bool) or isinstance(lecture, bool):
        return ours == lecture
    if isinstance(ours, (int, float)) and isinstance(lecture, (int, float)):
        if lecture == 0 or not math.isfinite(lecture):
            return ours == lecture or abs(ours) < 1e-12
        return abs(ours - lecture) <= SAME_REL * abs(lecture)
    if isinstance(ours, (list, tuple)) and isinstance(lecture, (list, tuple)):
        return len(ours) == len(lecture) and all(_same(a, b) for a, b in zip(ours, lecture))
    return str(ours) == str(lecture)


def _float(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


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


def check_settings(experiment: str, cfg: Mapping[str, Any], defaults: Mapping[str, Any], *,
                   minimum: Mapping[str, float] | None = None,
                   maximum: Mapping[str, tuple[float, str]] | None = None,
                   lengths: Mapping[str, tuple[int, int | None]] | None = None) -> None:
    """Range checks before any work: each setting in ``minimum`` (every item, for a tuple) is ≥
    its bound; in ``maximum`` ≤ its bound (with the reason); each tuple in ``lengths`` has
    lo..hi items (hi None: no upper bound). The error names the setting and gives an example."""
    def fail(key, what):
        example = ",".join(map(str, defaults[key])) if isinstance(defaults[key], (tuple, list)) \
            else defaults[key]
        raise OverrideError(f"experiment {experiment}: {key} {what}, got {_show(cfg[key])} "
                            f"(e.g. --set {key}={example})")
    for key, (lo, hi) in (lengths or {}).items():
        n = len(cfg[key])
        if n < lo or (hi is not None and n > hi):
            fail(key, f"needs {lo} item{'s' if lo != 1 else ''}" if lo == hi else
                 f"needs {lo} or more items" if hi is None else f"needs {lo} to {hi} items")
    for key, lo in (minimum or {}).items():
        if not all(_number(v) and v >= lo for v in _items(cfg[key])):
            fail(key, f"must be ≥ {lo}" + (" (every item)" if _is_seq(cfg[key]) else ""))
    for key, (hi, why) in (maximum or {}).items():
        if not all(_number(v) and v <= hi for v in _items(cfg[key])):
            fail(key, f"must be ≤ {hi} ({why})")


def _is_seq(v) -> bool:
    return isinstance(v, (tuple, list))


def _items(v) -> list:
    return list(v) if _is_seq(v) else [v]


def _number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and v == v  # NaN is no number here


def _show(v) -> str:
    return "(empty)" if _is_seq(v) and not v else ",".join(map(str, v)) if _is_seq(v) else repr(v)


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
        marks = [mark(c) for c in checks]
        rows = [{"claim": c.claim, "ours": c.ours, "lecture": c.lecture, "ok": symbol}
                | ({"why ours differs": why} if any(w for _, w in marks) else {})
                for c, (symbol, why) in zip(checks, marks)]
        parts.append(format_table(rows, title="\n[checks]"))
    return "\n".join(parts)


def format_summary(outputs: list[tuple], seconds: dict[str, float]) -> str:
    """The end of ``run all``: experiments run, claims held (✓ equal to the lecture's figure,
    ≈ held with ours differing in value), claims failed, and each ≈ with its reason."""
    checks = [(r.id, c, mark(c)) for _, r, cs in outputs for c in cs]
    count = {s: sum(m[0] == s for _, _, m in checks) for s in "✓≈✗"}
    lines = [wrap(f"== summary: {len(outputs)} experiments in {sum(seconds.values()):.0f} s; "
                  f"{len(checks)} lecture claims: {count['✓'] + count['≈']} hold "
                  f"({count['✓']} ✓ on the lecture's figure, {count['≈']} ≈ with ours "
                  f"differing in value), {count['✗']} ✗ failed ==", first="")]
    lines += [wrap(f"≈ {eid}: {c.claim}: ours {_brief(c.ours)}, lecture {_brief(c.lecture)} — "
                   f"{why}", first="  ", rest="    ")
              for eid, c, (symbol, why) in checks if symbol == "≈"]
    lines += [wrap(f"✗ {eid}: {c.claim}: ours {_brief(c.ours)}, lecture {_brief(c.lecture)}",
                   first="  ", rest="    ") for eid, c, (symbol, _) in checks if symbol == "✗"]
    return "\n".join(lines)


def _brief(x: Any) -> str:
    from mlsys_jax.tables import fmt

    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(fmt(v) for v in x) + "]"
    return fmt(x)
