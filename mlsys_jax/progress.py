"""Progress on stderr for long work: a live line on a terminal, one line per stage otherwise.

On a terminal the current stage and its item (``compiling plan 2 of 3``) are redrawn in place
with the elapsed time, also while one item runs long (a compile, a timed step): a daemon thread
redraws the line every ``tick_s``, cut to the terminal's width so that a redraw never wraps.
Elsewhere (a log, CI, a pipe) each stage prints one line when it starts, and a stage that runs
on prints one more line (with its current item) every ``every_s`` seconds, so logs stay short
and a long stage is visibly alive; no carriage returns. ``Progress(enabled=False)`` (``--quiet``)
prints nothing. Library code takes a ``progress`` argument and calls it only through
``stage``/``item``, so the same code runs silent in tests.

    progress = Progress("remat")
    progress.stage("compiling 3 plans")
    for k, plan in enumerate(plans, 1):
        progress.item(k, 3, f"plan at {plan.budget_bytes} bytes")
    progress.done()                  # or: with Progress("remat") as progress: ...
"""
from __future__ import annotations

import sys
import threading
import time


class Progress:
    """Stage and item lines for one command (``name`` prefixes each line)."""

    def __init__(self, name: str = "mlsys-jax", stream=None, enabled: bool = True,
                 terminal: bool | None = None, tick_s: float = 0.5, every_s: float = 30.0):
        self.name, self.stream, self.enabled = name, stream or sys.stderr, enabled
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty()) if terminal is None else terminal
        self.t0 = time.perf_counter()
        self._stage, self._item, self._width = "", "", 0
        self._lock = threading.Lock()
        self._ticker = None
        self._every_s, self._printed_at = every_s, self.t0
        tick = tick_s if self.terminal else min(every_s, 1.0)
        if self.enabled and tick > 0:
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, args=(tick,), daemon=True)
            self._ticker.start()

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0

    def stage(self, text: str) -> None:
        """A new stage of the work: printed once off a terminal, redrawn on one."""
        if not self.enabled:
            return
        with self._lock:
            self._stage, self._item = text, ""
            if self.terminal:
                self._draw()
            else:
                self._print_line()

    def item(self, k: int, n: int, text: str) -> None:
        """Item ``k`` of ``n`` in the current stage (a terminal shows it; a log shows it in the
        stage's next periodic line)."""
        if not self.enabled:
            return
        with self._lock:
            self._item = f"{k} of {n}: {text}"
            if self.terminal:
                self._draw()

    def done(self) -> None:
        """End the live line (a terminal keeps the last stage with the total time)."""
        if self._ticker is not None:
            self._stop.set()
        if self.enabled and self.terminal and self._item != "done":
            with self._lock:
                self._item = "done"
                self._draw()
                print(file=self.stream, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.done()

    def _line(self) -> str:
        line = f"{self.name}: [{self.elapsed_s:5.1f} s] {self._stage}"
        return line + f" — {self._item}" if self._item else line

    def _print_line(self) -> None:
        print(self._line(), file=self.stream, flush=True)  # a log's line: whole, one per stage
        self._printed_at = time.perf_counter()

    def _draw(self) -> None:
        from mlsys_jax.tables import terminal_width

        line = self._line()[:terminal_width() - 1]  # a line that wrapped could not be redrawn
        pad = max(0, self._width - len(line))
        self._width = len(line)
        print("\r" + line + " " * pad, end="", file=self.stream, flush=True)

    def _tick(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            with self._lock:
                if not self._stage:
                    continue
                if self.terminal:
                    self._draw()
                elif time.perf_counter() - self._printed_at >= self._every_s:
                    self._print_line()


SLOW_S = 2.0  # a stage this long gets a progress line (SlowStages)


class SlowStages:
    """Progress for stages that run long: a stage's line appears on stderr only once it has
    run :data:`SLOW_S` seconds (then every later stage's at once), so a small model's report
    leaves stderr empty and a one-line error stays one line, while a large model's trace or
    XLA's compile shows within seconds."""

    def __init__(self, name: str, *, enabled: bool = True):
        self.name, self.enabled = name, enabled
        self.shown = None  # the Progress, once a stage was slow
        self._lock, self._timer = threading.Lock(), None

    def stage(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            if self.shown is not None:
                self.shown.stage(text)
                return
            self._timer = threading.Timer(SLOW_S, self._show, (text,))
            self._timer.daemon = True
            self._timer.start()

    def _show(self, text: str) -> None:
        with self._lock:
            if self.shown is None:
                self.shown = Progress(self.name)
                self.shown.t0 -= SLOW_S  # the stage began SLOW_S ago
            self.shown.stage(text)

    def done(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self.enabled = False
        if self.shown is not None:
            self.shown.done()

    def __enter__(self) -> "SlowStages":
        return self

    def __exit__(self, *exc) -> None:
        self.done()


SILENT = Progress(enabled=False)
