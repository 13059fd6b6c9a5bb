"""Progress on stderr: one line per stage in a log, a live line on a terminal, nothing when quiet."""
import io
import re
import time

from mlsys_jax.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_one_line_per_stage_and_no_items():
    out = io.StringIO()
    p = Progress("remat", stream=out)
    p.stage("compiling no remat")
    p.item(1, 3, "plan 1")
    p.stage("timing 2 programs")
    p.done()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and all(re.fullmatch(r"remat: \[ *\d+\.\d s\] .+", ln) for ln in lines)
    assert lines[0].endswith("compiling no remat") and "plan 1" not in out.getvalue()


def test_a_terminal_redraws_one_line_with_items_and_elapsed_time():
    out = Terminal()
    p = Progress("remat", stream=out, tick_s=0)
    p.stage("compiling plans")
    p.item(2, 3, "plan 2")
    p.done()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.count("\r") == 3      # one line, redrawn in place
    assert "compiling plans — 2 of 3: plan 2" in text and re.search(r"\[ *\d+\.\d s\]", text)


def test_quiet_prints_nothing():
    for stream in (io.StringIO(), Terminal()):
        p = Progress("remat", stream=stream, enabled=False)
        p.stage("x")
        p.item(1, 1, "y")
        p.done()
        assert stream.getvalue() == ""


def test_a_long_stage_in_a_log_prints_a_line_now_and_then_with_its_item():
    out = io.StringIO()
    with Progress("fuzz", stream=out, every_s=0.2) as p:
        p.stage("checking programs")
        p.item(3, 9, "program 3")
        time.sleep(0.7)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and "\r" not in out.getvalue()
    assert lines[-1].endswith("checking programs — 3 of 9: program 3")
    n = len(lines)
    time.sleep(0.5)                                   # done: the heartbeat has stopped
    assert len(out.getvalue().splitlines()) == n


def test_a_redrawn_line_never_wraps_a_narrow_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "50")
    out = Terminal()
    p = Progress("remat", stream=out, tick_s=0)
    p.stage("compiling " + "a very long plan name " * 8)
    p.done()
    assert max(len(part) for part in re.split(r"[\r\n]", out.getvalue())) < 50
