"""docs/api.md's examples run (tests/test_doctests.py runs the library's docstrings only): the
cheap ones as written, the shard run marked to skip (test_shard.py runs it)."""
import doctest
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def test_the_api_page_examples_pass():
    result = doctest.testfile(str(DOC), module_relative=False,
                              optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 10 and result.failed == 0, result
