"""Progress on stderr for long work: a live line on a terminal, one line per stage otherwise.

On a terminal the current stage and its item (``compiling plan 2 of 3``) are redrawn in place
with the elapsed time, also while one item runs long (a compile, a timed step): a daemon thread
redraws the line every ``tick_s``. Elsewhere (a log, CI, a pipe) each stage prints one line when
it starts and items print nothing, so logs stay short. ``Progress(enabled=False)`` (``--quiet``)
prints nothing. Library code takes a ``progress`` argument and calls it only through
``stage``/``item``, so the same code runs silent in tests.

    progress = Progress("remat")
    progress.stage("compiling 3 plans")
    for k, plan in enumerate(plans, 1):
        progress.item(k, 3, f"plan at {plan.budget_bytes} bytes")
    progress.done()
"""
from __future__ import annotations

import sys
import threading
import time


class Progress:
    """Stage and item lines for one command (``name`` prefixes each line)."""

    def __init__(self, name: str = "mlsys-jax", stream=None, enabled: bool = True,
                 terminal: bool | None = None, tick_s: float = 0.5):
        self.name, self.stream, self.enabled = name, stream or sys.stderr, enabled
        isatty = getattr(self.stream, "isatty", None)
        self.terminal = bool(isatty and isatty()) if terminal is None else terminal
        self.t0 = time.perf_counter()
        self._stage, self._item, self._width = "", "", 0
        self._lock = threading.Lock()
        self._ticker = None
        if self.enabled and self.terminal and tick_s > 0:
            self._stop = threading.Event()
            self._ticker = threading.Thread(target=self._tick, args=(tick_s,), daemon=True)
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
                print(f"{self.name}: [{self.elapsed_s:5.1f} s] {text}", file=self.stream,
                      flush=True)

    def item(self, k: int, n: int, text: str) -> None:
        """Item ``k`` of ``n`` in the current stage (a terminal shows it; a log does not)."""
        if not (self.enabled and self.terminal):
            return
        with self._lock:
            self._item = f"{k} of {n}: {text}"
            self._draw()

    def done(self) -> None:
        """End the live line (a terminal keeps the last stage with the total time)."""
        if self._ticker is not None:
            self._stop.set()
        if self.enabled and self.terminal:
            with self._lock:
                self._item = "done"
                self._draw()
                print(file=self.stream, flush=True)

    def _draw(self) -> None:
        line = f"{self.name}: [{self.elapsed_s:5.1f} s] {self._stage}"
        if self._item:
            line += f" — {self._item}"
        pad = max(0, self._width - len(line))
        self._width = len(line)
        print("\r" + line + " " * pad, end="", file=self.stream, flush=True)

    def _tick(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            with self._lock:
                if self._stage:
                    self._draw()


SILENT = Progress(enabled=False)
