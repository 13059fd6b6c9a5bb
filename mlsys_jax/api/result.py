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


class ApiResult:
    """One call's figures (``data``: the ``--json`` object) and how to show them.

    A subclass gives ``_text()`` (the text report; it may print it: what it prints is
    captured), ``_lines()`` (the lines of ``repr``) and ``flags`` (its command's flags as the
    API says them, ``api.speak``); both are called when asked for, so a table fits the terminal
    it is shown on.
    """

    command = ""
    flags: dict = {}

    def __init__(self, data: dict, *, name: str):
        self._data = data
        self.name = name

    def _text(self) -> str | None:
        raise NotImplementedError

    def _lines(self) -> list[str]:
        raise NotImplementedError

    def _speak(self, text: str) -> str:
        from mlsys_jax.api.speak import translate

        return translate(text, self.flags)

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
            text = self._text()
        return self._speak((buffer.getvalue() + (text or "")).strip("\n"))

    def __repr__(self) -> str:
        from mlsys_jax.tables import wrap

        lines = self._lines() + ["(.table(): the report; .to_json(): every figure)"]
        return "\n".join(wrap(line, first="", rest="  ") for line in lines)

    def _repr_html_(self) -> str:
        head = "<br>".join(html.escape(line) for line in self._lines())
        return f"<div><b>{head}</b><pre>{html.escape(self.table())}</pre></div>"
