"""What every experiment's printed report holds to: it fits a terminal of 120 columns and one of
80, and nothing is lost — every column is in the text (headers may wrap) and in ``--json``."""
import os
import re
from unittest import mock

from mlsys_jax.results import format_result
from mlsys_jax.tables import columns


def assert_fits_a_terminal(result, checks) -> None:
    for width in (80, 120):
        with mock.patch.dict(os.environ, {"COLUMNS": str(width)}):
            wide = [line for line in format_result(result, checks).splitlines()
                    if len(line) > width]
        assert wide == [], width
    text = format_result(result, checks)
    as_json = result.to_json(checks)["tables"]
    for name, rows in result.tables.items():
        assert columns(as_json[name]) == columns(rows), name
        for col in columns(rows):
            assert all(piece in text for piece in re.findall(r"[^_ ]+_?", col)), (name, col)
