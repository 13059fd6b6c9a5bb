"""One self-contained HTML page (``inspect --html OUT.html``): headings, tables, preformatted
text, a nested list and PNG plots embedded as base64, with no external asset (no script, no
stylesheet or font fetched), so the file can be mailed or attached to an issue as it is.

Every text that goes into the page passes :func:`html.escape`. Pieces are strings of HTML built
by the functions below; :func:`page` puts them together.

>>> table([{"module": "<Dense>", "µs": 1.5}])
'<table><tr><th>module</th><th>µs</th></tr><tr><td>&lt;Dense&gt;</td><td>1.5</td></tr></table>'
"""
from __future__ import annotations

import base64
import html
import os
import tempfile
from typing import Callable, Mapping, Sequence

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}
table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px;
text-align:left}th{background:#f0f0f0}pre{background:#f8f8f8;padding:1em;overflow-x:auto}
ul.tree{font-family:monospace}.note{color:#666}img{max-width:100%}"""


def escape(x) -> str:
    return html.escape(str(x))


def heading(text: str, level: int = 2) -> str:
    return f"<h{level}>{escape(text)}</h{level}>"


def paragraph(text: str, *, note: bool = False) -> str:
    return (f'<p class="note">{escape(text)}</p>' if note else f"<p>{escape(text)}</p>")


def pre(text: str) -> str:
    """Text as the terminal shows it (tables fitted to its width)."""
    return f"<pre>{escape(text)}</pre>"


def table(rows: Sequence[Mapping]) -> str:
    """A table of dict rows; the columns are the first row's keys and any later ones."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(_cell(r.get(c, '')))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(x) -> str:
    """Floats to four significant digits (as the terminal's tables round them)."""
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def tree(nodes: Sequence[tuple]) -> str:
    """A nested list of ``(text, children)`` pairs, children being such pairs too."""
    if not nodes:
        return ""
    items = "".join(f"<li>{escape(text)}{tree(children)}</li>" for text, children in nodes)
    return f'<ul class="tree">{items}</ul>'


def image(png: bytes, alt: str) -> str:
    """A PNG embedded in the page (a data: URL, base64)."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def png_of(draw: Callable[[str], object]) -> bytes | None:
    """The bytes of the PNG ``draw(path)`` writes (None when it draws nothing: no matplotlib)."""
    with tempfile.TemporaryDirectory(prefix="mlsys-jax-html-") as d:
        path = os.path.join(d, "plot.png")
        if draw(path) is None or not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return f.read()


def page(title: str, parts: Sequence[str]) -> str:
    """The whole document: ``parts`` (HTML pieces from this module) under the title."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>\n"
            + heading(title, 1) + "\n" + "\n".join(parts) + "\n</body></html>\n")


def write(path: str, text: str) -> str:
    """Write the page (the caller checked ``path`` before its work); returns ``path``."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path
