"""Running a user's file: a missing library names the extra that installs it; the import bound
counts waiting, not computing, and its message says which it was."""
import threading
import time

import pytest

from mlsys_jax.cli import user_code
from mlsys_jax.errors import MlsysError


def _missing(name):
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.mark.parametrize("module, extra", [("flax", "ecosystem"), ("haiku", "ecosystem"),
                                           ("flax.linen", "ecosystem"), ("matplotlib", "plot")])
def test_a_missing_library_names_the_extra_that_installs_it(module, extra):
    with pytest.raises(MlsysError, match=rf"No module named .*pip install -e '\.\[{extra}\]'"):
        user_code.run(lambda: _missing(module), "importing m.py", "could not import m.py")


def test_a_missing_module_of_the_users_own_gets_no_hint():
    with pytest.raises(MlsysError) as e:
        user_code.run(lambda: _missing("my_private_helpers"), "importing m.py", "could not import")
    assert "pip install" not in str(e.value)


def test_waiting_is_bounded_and_named_as_waiting():
    with user_code.time_bound(1.0), pytest.raises(MlsysError, match="waited 1 s using no CPU"):
        user_code.run(lambda: time.sleep(30), "importing m.py", "could not import m.py")


@pytest.mark.slow
def test_computing_is_not_cut_at_the_bound(monkeypatch):
    monkeypatch.setattr(user_code, "BUSY_FACTOR", 3)

    stop = threading.Event()

    def spin(seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not stop.is_set():
            pass
        return "built"

    with user_code.time_bound(1.0):
        assert user_code.run(lambda: spin(1.8), "importing m.py", "could not import") == "built"
        try:
            with pytest.raises(MlsysError, match=r"still computing after 3 s \(3 × --import-"):
                user_code.run(lambda: spin(30), "importing m.py", "could not import m.py")
        finally:
            stop.set()          # the abandoned worker stops spinning
