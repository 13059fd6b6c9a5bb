"""``inspect --html``: one self-contained page (viz/html.py), everything escaped, the module tree,
the tables, the roofline chart embedded as a base64 PNG (or a note without matplotlib)."""
import base64
import re
from html import unescape

import pytest

from mlsys_jax import cli
from mlsys_jax.viz import html
from mlsys_jax.viz.plots import unavailable_reason
from tests.viz.models import write


def _external(page: str) -> list[str]:
    """Anything the page would fetch: scripts, stylesheets, images or frames by URL."""
    return re.findall(r"<(?:script|link|iframe)\b|\b(?:src|href)=\"(?!data:)", page)


def test_text_is_escaped_and_the_page_fetches_nothing():
    page = html.page("<b>model</b>", [
        html.table([{"module": "<script>alert(1)</script>", "µs": 1.23456}]),
        html.tree([("net & co", [("<mlp>", [])])]), html.pre("a < b"),
        html.image(b"\x89PNG fake", 'alt "quoted"')])
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<td>1.235</td>" in page and "net &amp; co" in page and "&lt;mlp&gt;" in page
    assert "<pre>a &lt; b</pre>" in page and 'alt="alt &quot;quoted&quot;"' in page
    assert _external(page) == []


@pytest.mark.slow
def test_inspect_html_holds_the_tree_the_tables_and_the_roofline(tmp_path, capsys):
    out = tmp_path / "page.html"
    assert cli.main(["inspect", f"{write(tmp_path)}:make", "--html", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"HTML page written to {out}" in printed
    page = out.read_text()
    assert _external(page) == []
    for section in ("Module tree", "Modules", "Kernels", "Roofline", "Report as printed"):
        assert f"<h2>{section}</h2>" in page
    assert re.search(r"<li>net: [^<]*<ul class=\"tree\"><li>block0: ", page)
    assert page.count("<table>") == 2 and "<th>µs fused</th>" in page
    [as_printed] = re.findall(r"<pre>(.*?)</pre>", page, re.S)
    assert len(as_printed) > 200 and unescape(as_printed).strip() in printed  # what was printed
    found = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    if unavailable_reason():
        assert not found and html.escape(unavailable_reason()) in page
    else:
        assert len(found) == 1 and base64.b64decode(found[0]).startswith(b"\x89PNG")
