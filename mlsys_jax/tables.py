"""Tables of row dicts, rendered once for the terminal and once for markdown.

Every command and experiment prints its tables through :func:`format_table` (text) or
:func:`markdown_table` (the ``--report`` file). Both take the same rows, the same column order
(first seen) and the same cell rendering (:func:`fmt`).

Text output fits the terminal (:func:`terminal_width`: ``COLUMNS`` when set, else the
terminal's own width, else ``WIDTH``) without losing a cell: a table that is too wide
first wraps its headers and its long text cells (at spaces, after ``+``, and in headers after
underscores; a dotted rule sets apart rows of several lines), then, if the columns still do not
fit side by side, prints them in stacked blocks that each repeat the first column (the row's
name). ``--json`` and ``--report`` are not affected: they have no width.
"""
from __future__ import annotations

import math
import re
import shutil
import textwrap
from typing import Any, Iterable

import numpy as np

WIDTH = 120        # the columns text output uses where no terminal tells (a log, a pipe)
NARROWEST = 40     # a terminal narrower than this is treated as this wide
INDENT = "  "      # every table line starts with it
SEP = " | "
MIN_TEXT = 16      # a column of prose is not wrapped narrower than this
MAX_WORD = 40      # a single word wider than this may be cut to fit
ROOMY = 20         # before columns are split into blocks, prose may wrap down to this width


def terminal_width() -> int:
    """The columns text output may use: ``COLUMNS`` when set, else the terminal's width, else
    :data:`WIDTH` (off a terminal). Read at each call, so a resized terminal is followed."""
    return max(NARROWEST, shutil.get_terminal_size((WIDTH, 24)).columns)


def fmt(x: Any) -> str:
    """Render a cell: floats with 4 significant digits (scientific when tiny/huge)."""
    if isinstance(x, bool) or x is None:  # ✓/✗ are kept for checked claims (results.format_result)
        return "" if x is None else ("yes" if x else "no")
    if isinstance(x, (np.generic,)):
        x = x.item()
    if isinstance(x, float):
        if x == 0:
            return "0"
        if not math.isfinite(x):
            return str(x)
        ax = abs(x)
        if ax < 1e-3 or ax >= 1e6:
            return f"{x:.2e}"
        return f"{x:.4g}"
    return str(x)


def columns(rows: Iterable[dict]) -> list[str]:
    """Column names in first-seen order over all rows."""
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    return cols


def markdown_table(rows: list[dict]) -> str:
    """A GitHub-flavoured markdown table of row dicts (every column; lists as ``a, b, c``)."""
    if not rows:
        return "_(empty)_"
    cols = columns(rows)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(_markdown_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _markdown_cell(x: Any) -> str:
    if isinstance(x, (list, tuple)):
        return ", ".join(_markdown_cell(v) for v in x)
    return fmt(x).replace("|", "\\|").replace("\n", " ")


def format_table(rows: list[dict], title: str | None = None, width: int | None = None) -> str:
    """Plain-text table of row dicts, at most ``width`` characters a line (see the module doc).

    >>> print(format_table([{"kernel": "matmul", "us": 4.12}, {"kernel": "relu", "us": 4.0}]))
      kernel | us
      -------+-----
      matmul | 4.12
      relu   | 4
    """
    if not rows:
        return f"{title}\n{INDENT}(empty)" if title else "(empty)"
    width = terminal_width() if width is None else width
    cols = columns(rows)
    cells = [[fmt(r.get(c)).replace("\n", " ") for c in cols] for r in rows]
    table = [cols] + cells
    natural = [max(len(row[i]) for row in table) for i in range(len(cols))]
    least = [_narrowest(i, table) for i in range(len(cols))]
    prose = [_is_prose(i, table) for i in range(len(cols))]
    # columns are split into stacked blocks only when they cannot sit side by side with headers
    # wrapped onto two lines and every column of prose at least ROOMY wide (or its natural width)
    asks = [min(n, max(lo, ROOMY)) if p else _two_line(i, table, lo)
            for i, (n, lo, p) in enumerate(zip(natural, least, prose))]
    out = [_title(title, width)] if title else []
    for k, block in enumerate(_blocks(asks, width)):
        part = [[row[i] for i in block] for row in table]
        widths = _fit(part, *([v[i] for i in block] for v in (natural, least, prose)), width)
        out += [""] * (k > 0) + _render(part, widths)
    return "\n".join(out)


def _title(title: str, width: int) -> str:
    """A table's title wrapped to ``width`` (its leading blank lines kept; later lines indented
    one space past its ``[``)."""
    body = title.lstrip("\n")
    return title[:len(title) - len(body)] + wrap(body, first="", rest=" ", width=width)


def wrap(text: str, first: str = INDENT, rest: str | None = None, width: int | None = None) -> str:
    """A paragraph (a note, a summary line) wrapped to ``width`` (default: the terminal's) with
    hanging indent ``rest``."""
    width = terminal_width() if width is None else width
    rest = " " * len(first) if rest is None else rest
    return "\n".join(textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest,
                                   break_long_words=True, break_on_hyphens=False)) or first.rstrip()


# --- fitting a wide table -------------------------------------------------------------------

def _pieces(text: str, header: bool = False) -> list[str]:
    """``text`` cut where it may wrap: after each run of spaces or of ``+`` (as in a fused
    kernel's name, not in ``1.2e+04``), and in a header also of underscores."""
    word = r"(?:[^ +_]|\+(?=\d))*(?:[+_]+| +|$)" if header else r"(?:[^ +]|\+(?=\d))*(?:\++| +|$)"
    return [p for p in re.findall(word, text) if p]


def _is_prose(i: int, table: list[list[str]]) -> bool:
    """Column ``i`` holds text that wraps (a cell of several words), not only atoms."""
    return any(len(_pieces(row[i].strip())) > 1 for row in table[1:])


def _narrowest(i: int, table: list[list[str]]) -> int:
    """How narrow column ``i`` may get: its longest word (cut at MAX_WORD), prose ≥ MIN_TEXT."""
    words = [len(p.rstrip()) for k, row in enumerate(table) for p in _pieces(row[i], k == 0)]
    least = min(max(words, default=1), MAX_WORD)
    if _is_prose(i, table):  # keep lines of prose readable
        least = max(least, MIN_TEXT)
    return min(max(least, 1), max(len(row[i]) for row in table))


def _total(widths: list[int]) -> int:
    return len(INDENT) + sum(widths) + len(SEP) * (len(widths) - 1)


def _blocks(asks: list[int], width: int) -> list[list[int]]:
    """Column index groups that fit side by side; groups after the first repeat column 0."""
    if _total(asks) <= width or len(asks) == 1:
        return [list(range(len(asks)))]
    blocks, block = [], [0]
    for i in range(1, len(asks)):
        if len(block) > 1 and _total([asks[j] for j in block + [i]]) > width:
            blocks.append(block)
            block = [0]
        block.append(i)
    return blocks + [block]


def _two_line(i: int, table: list[list[str]], least: int) -> int:
    """The narrowest width (≥ ``least``) at which column ``i``'s header takes at most two lines."""
    return next(w for w in range(least, max(least, len(table[0][i])) + 1)
                if len(_wrap_cell(table[0][i], w, True)) <= 2)


def _fit(table: list[list[str]], natural: list[int], least: list[int], prose: list[bool],
         width: int) -> list[int]:
    """Widths that fit ``width``, none below its least. In turn: wrap the headers of columns
    without prose onto two lines where that saves 3 characters or more (widest first); narrow the
    columns of prose, one character at a time, where that adds the fewest lines (the widest of
    those); wrap headers further; give back what is left over."""
    widths = list(natural)

    def narrow_headers(floor: list[int]) -> None:
        while _total(widths) > width:
            cols = [i for i, w in enumerate(widths) if not prose[i] and w > floor[i]]
            if not cols:
                return
            widths[max(cols, key=lambda i: widths[i])] -= 1

    two_lines = [n if p else _two_line(i, table, lo)
                 for i, (n, lo, p) in enumerate(zip(natural, least, prose))]
    narrow_headers([t if n - t >= 3 else n for n, t in zip(natural, two_lines)])
    lines: dict[tuple[int, int], list[int]] = {}  # (column, width) -> lines per row

    def count(i: int, w: int) -> list[int]:
        if (i, w) not in lines:
            lines[i, w] = [len(_wrap_cell(row[i], w, k == 0)) for k, row in enumerate(table)]
        return lines[i, w]

    while _total(widths) > width:
        now = [count(i, w) for i, w in enumerate(widths)]
        top2 = [sorted(col[r] for col in now)[-2:] for r in range(len(table))]

        def height(i: int) -> int:  # table height with column i one character narrower
            others = [t[0] if len(t) > 1 and now[i][r] == t[1] else t[-1] for r, t in enumerate(top2)]  # noqa: B023 (called in this iteration)
            return sum(max(o, n) for o, n in zip(others, count(i, widths[i] - 1)))

        cols = [i for i, w in enumerate(widths) if prose[i] and w > least[i]]
        if not cols:
            break
        widths[min(cols, key=lambda i: (height(i), -widths[i]))] -= 1
    narrow_headers(least)
    for i in sorted(range(len(widths)), key=lambda i: natural[i] - widths[i]):  # room left over:
        widths[i] += min(natural[i] - widths[i], max(width - _total(widths), 0))  # unwrap again
    return widths


def _wrap_cell(text: str, width: int, header: bool) -> list[str]:
    if len(text) <= width:
        return [text]
    lines, line = [], ""
    for piece in _pieces(text, header):
        if line and len((line + piece).rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        line += piece
        while len(line.rstrip()) > width:  # a word longer than the column: cut it
            lines.append(line[:width])
            line = line[width:]
    return lines + [line.rstrip()] if line.strip() else lines


def _render(table: list[list[str]], widths: list[int]) -> list[str]:
    """Header, rule and rows; a wrapped cell continues on the next lines of its column."""
    def lines(row, header=False):
        wrapped = [_wrap_cell(cell, w, header) for cell, w in zip(row, widths)]
        return [(INDENT + SEP.join((w[k] if k < len(w) else "").ljust(width)
                                   for w, width in zip(wrapped, widths))).rstrip()
                for k in range(max(len(w) for w in wrapped))]

    rule = INDENT + "-+-".join("-" * w for w in widths)
    out = [*lines(table[0], header=True), rule]
    body = [lines(row) for row in table[1:]]
    for k, row in enumerate(body):  # a dotted rule shows where a row of several lines begins and ends
        if k and (len(row) > 1 or len(body[k - 1]) > 1):
            out.append(rule.replace("-", "·"))
        out += row
    return out
