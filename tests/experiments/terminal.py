"""What every experiment's printed report holds to: it fits a 120-column terminal, and nothing is
lost — every column is in the text (headers may wrap) and in ``--json``."""
import re

from mlsys_jax.results import format_result
from mlsys_jax.tables import WIDTH, columns


def assert_fits_a_terminal(result, checks) -> None:
    text = format_result(result, checks)
    assert [line for line in text.splitlines() if len(line) > WIDTH] == []
    as_json = result.to_json(checks)["tables"]
    for name, rows in result.tables.items():
        assert columns(as_json[name]) == columns(rows), name
        for col in columns(rows):
            assert all(piece in text for piece in re.findall(r"[^_ ]+_?", col)), (name, col)
