"""Budgets as people say them: the least, bytes with units, percentages; one line for the rest."""
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.planner.budget import parse_budget, percent


@pytest.mark.parametrize("text, kind, value", [
    ("60%", "percent", 60.0), ("150%", "percent", 150.0), ("2_000_000", "bytes", 2_000_000),
    ("2,000,000", "bytes", 2_000_000), (2000000, "bytes", 2_000_000), ("700MB", "bytes", 7e8),
    ("1.5GiB", "bytes", 1.5 * 2**30), ("64 KiB", "bytes", 65536), ("1e6", "bytes", 1e6),
    ("min", "min", 0), ("0", "min", 0), ("0%", "min", 0), (0, "min", 0)])
def test_forms_people_write(text, kind, value):
    b = parse_budget(text)
    assert (b.kind, b.value) == (kind, value)


def test_bytes_of_no_remat():
    assert parse_budget("50%").bytes_of(1001) == 500           # floor: never above the budget
    assert parse_budget("700MB").bytes_of(1) == 700_000_000
    assert parse_budget("min").bytes_of(1001) is None


@pytest.mark.parametrize("text, why", [
    ("inf", "not a finite number"), ("inf%", "not a finite number"), ("nan", "not a finite"),
    ("NaN%", "not a finite"), ("-5", "negative"), ("-1%", "negative"), ("0.5", "less than one"),
    ("12x", "got '12x'"), ("abc%", "got 'abc%'"), ("3 parsecs", "got '3 parsecs'"), ("", "got ''"),
    (True, "got True")])
def test_bad_budgets_are_one_line_naming_the_input(text, why):
    with pytest.raises(MlsysError) as e:
        parse_budget(text)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("budget must be a positive byte count") and why in msg


def test_percentages_print_the_digits_that_tell_them_apart():
    assert percent(717_234_688, 1_432_230_912, 50.0) == "50.1%"   # not "50%" beside a 50% budget
    assert percent(500, 1000, 50.0) == "50%"                      # equal figures stay short
    assert percent(5001, 10_000, 50.0, 50.02) == "50.01%"
    assert percent(1, 3) == "33%"
