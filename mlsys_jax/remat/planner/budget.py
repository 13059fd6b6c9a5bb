"""A memory budget as people write it: bytes, or a percentage of no remat's compiled temp bytes."""
from __future__ import annotations

from mlsys_jax.errors import MlsysError


def parse_budget(budget) -> tuple[float, bool]:
    """``2000000`` -> (2000000, False); ``'60%'`` -> (60.0, True); anything else: MlsysError."""
    text = str(budget).strip().replace("_", "").replace(",", "")
    try:
        value = float(text[:-1]) if text.endswith("%") else int(text)
    except ValueError:
        value = -1
    if not value > 0 or isinstance(budget, bool):
        raise MlsysError(f"budget must be a positive byte count (e.g. 2000000) or a percentage "
                         f"of no remat's compiled temp bytes (e.g. 60%); got {budget!r}")
    return value, text.endswith("%")
