"""A memory budget as people say it: the least, bytes with or without a unit, or a percentage.

``min`` (also ``0`` and ``0%``) asks for the least compiled temp bytes any plan reaches; ``60%`` is
of no remat's compiled temp bytes; ``2000000``, ``2_000_000``, ``700MB``, ``1.5GiB`` are bytes.
Anything else — ``inf``, ``nan``, a negative number, an unknown unit — is one line naming it.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from mlsys_jax.errors import MlsysError

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
FORMS = ("a positive byte count (2000000, 700MB, 1.5GiB), a percentage of no remat's compiled "
         "temp bytes (60%) or min (also 0: the least any plan reaches)")


@dataclass(frozen=True)
class Budget:
    """``kind`` is "min", "bytes" or "percent"; ``value`` the bytes or the percentage."""

    kind: str
    value: float = 0.0
    text: str = ""

    def bytes_of(self, no_remat_bytes: int) -> int | None:
        """The budget in bytes (None for "min")."""
        if self.kind == "min":
            return None
        if self.kind == "percent":
            return int(no_remat_bytes * self.value / 100)
        return int(self.value)

    def describe(self, no_remat_bytes: int) -> str:
        """How the budget reads beside its bytes: ``50% of no remat's 1432230912``."""
        if self.kind == "percent":
            return f"{self.text} of no remat's {no_remat_bytes}"
        return "the least any plan reaches" if self.kind == "min" else f"{self.text}"


def parse_budget(budget) -> Budget:
    """``'60%'``, ``2000000``, ``'700MB'``, ``'min'`` (``0``, ``'0%'``) -> Budget; else MlsysError."""
    if isinstance(budget, Budget):
        return budget
    text = str(budget).strip()
    if isinstance(budget, bool) or not text:
        raise MlsysError(f"budget must be {FORMS}; got {budget!r}")
    if text.lower() in ("min", "minimum", "least"):
        return Budget("min", 0.0, text)
    flat = text.replace("_", "").replace(",", "").replace(" ", "")
    match = re.fullmatch(r"([+-]?[0-9.eE+-]+|[+-]?inf(?:inity)?|nan)(%|[a-zA-Z]*)", flat,
                         flags=re.IGNORECASE)
    try:
        number = float(match.group(1)) if match else None
    except ValueError:
        number = None
    unit = match.group(2).lower() if match else ""
    if number is None or (unit != "%" and unit not in UNITS):
        raise MlsysError(f"budget must be {FORMS}; got {budget!r}")
    if math.isnan(number) or math.isinf(number):
        raise MlsysError(f"budget must be {FORMS}; got {text!r}, which is not a finite number")
    if number < 0:
        raise MlsysError(f"budget must be {FORMS}; got {text!r}, which is negative")
    if number == 0:
        return Budget("min", 0.0, text)
    if unit == "%":
        return Budget("percent", number, text)
    nbytes = number * UNITS[unit]
    if nbytes < 1:
        raise MlsysError(f"budget must be {FORMS}; got {text!r}, less than one byte")
    return Budget("bytes", math.floor(nbytes), text)


def percent(part: float, whole: float, *others: float) -> str:
    """``part`` as a percentage of ``whole``, with the decimals that tell it apart from
    ``others`` (percentages too) — 50.08%, not 50%, beside a budget of 50%."""
    value = 100 * part / whole if whole else math.inf
    for digits in range(0, 7):
        shown = round(value, digits)
        if all(round(o, digits) != shown for o in others if o != value):
            break
    return f"{value:.{digits}f}%"
