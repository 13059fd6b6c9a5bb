"""The result every Python API call returns: the command's ``--json`` object, a few headline
lines, and the command's text report on demand.

``repr(r)`` is the headline (the verdict and the figures a reader looks at first), ``r.table()``
the text tables the command prints (``mlsys_jax.tables.format_table``, fitted to the terminal
when it is called), ``r.to_json()`` the object ``mlsys-jax COMMAND --json`` prints, ``r[key]``
one entry of it, and ``_repr_html_`` the report for Jupyter.
"""
from __future__ import annotations

import contextlib
import html
import io
import json
from typing import Callable


class ApiResult:
    """One call's figures (``data``: the ``--json`` object) and how to show them.

    ``render`` returns the text report (it may print it: what it prints is captured), and
    ``headline`` the lines of ``repr``; both are called when asked for, so a table fits the
    terminal it is shown on.
    """

    command = ""

    def __init__(self, data: dict, *, name: str, render: Callable[[], str | None],
                 headline: Callable[[], list[str]], speak: Callable[[str], str] = str):
        self._data = data
        self.name = name
        self._render = render
        self._headline = headline
        self._speak = speak

    def to_json(self) -> dict:
        """The object ``mlsys-jax COMMAND --json`` prints (a copy: JSON types only)."""
        return json.loads(json.dumps(self._data))

    def __getitem__(self, key: str):
        return self._data[key]

    def keys(self):
        return self._data.keys()

    def table(self) -> str:
        """The command's text report (its tables and notes), as the terminal would show it;
        its hints name the API's arguments, not the command's flags."""
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            text = self._render()
        return self._speak((buffer.getvalue() + (text or "")).strip("\n"))

    def __repr__(self) -> str:
        from mlsys_jax.tables import wrap

        lines = self._headline() + ["(.table(): the report; .to_json(): every figure)"]
        return "\n".join(wrap(line, first="", rest="  ") for line in lines)

    def _repr_html_(self) -> str:
        head = "<br>".join(html.escape(line) for line in self._headline())
        return f"<div><b>{head}</b><pre>{html.escape(self.table())}</pre></div>"
