"""The runnable examples in the library's docstrings pass: every module under mlsys_jax/ whose
source has a ``>>>`` example is imported and its examples run (the test session's set-up: 8
simulated CPU devices, float64 enabled)."""
import doctest
import importlib
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "mlsys_jax"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
FEWEST = 10  # docstrings with examples: the entry points a reader starts from


def modules_with_examples() -> list[str]:
    return sorted(".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
                  for p in PKG.rglob("*.py") if ">>>" in p.read_text())


@pytest.mark.parametrize("name", modules_with_examples())
def test_examples_pass(name):
    module = importlib.import_module(name)  # a module that fails to import fails here
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} has '>>>' but no example doctest finds"
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_entry_points_have_examples():
    count = 0
    for name in modules_with_examples():
        module = importlib.import_module(name)
        count += sum(1 for t in doctest.DocTestFinder().find(module, name) if t.examples)
    assert count >= FEWEST, f"{count} docstrings with examples, want at least {FEWEST}"
