"""``inspect --dot``: the DOT that Graphviz renders (``dot -Tsvg``, the ``graphviz`` package of
apt), with real line breaks and readable names in its labels, one cluster per module, and one
node per module past 300 nodes."""
import re
import shutil
import subprocess

import pytest

from mlsys_jax import cli, ir
from mlsys_jax.ir.dot import COLLAPSE_OVER, label
from tests.viz.models import write

NODE = re.compile(r"^\s*(\w+) \[label=\"((?:[^\"\\]|\\.)*)\"", re.M)


@pytest.fixture
def user_file(tmp_path):
    return write(tmp_path)


def render(dot_text: str) -> str:
    """The SVG Graphviz draws of ``dot_text`` (the test fails, naming the fix, without it)."""
    assert shutil.which("dot"), "Graphviz's dot is not installed: apt-get install graphviz"
    done = subprocess.run(["dot", "-Tsvg"], input=dot_text, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    return done.stdout


def svg_texts(svg: str) -> list[str]:
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def _dot(user_file, tmp_path, fn: str, capsys) -> str:
    path = tmp_path / f"{fn}.dot"
    assert cli.main(["inspect", f"{user_file}:{fn}", "--dot", str(path)]) == 0
    assert f"DOT written to {path}" in capsys.readouterr().out
    return path.read_text()


def test_a_small_model_renders_with_line_breaks_names_and_module_clusters(user_file, tmp_path,
                                                                           capsys):
    text = _dot(user_file, tmp_path, "make", capsys)
    svg = render(text)
    texts = svg_texts(svg)
    assert texts and not any("\\n" in t or "Var(id=" in t for t in texts)
    assert "Var(id=" not in text and "\\\\n" not in text
    assert {"in0", "f32[8,8]", "matmul", "tanh", "relu"} <= set(texts)  # name, then shape
    clusters = re.findall(r"subgraph cluster_m\d+ \{ label=\"([^\"]+)\"", text)
    assert sorted(clusters) == sorted(["net", "block0", "block1"] + ["attn", "mlp"] * 2)
    assert len(NODE.findall(text)) < COLLAPSE_OVER and "equations" not in text


def test_over_300_nodes_collapse_to_one_node_per_module(user_file, tmp_path, capsys):
    text = _dot(user_file, tmp_path, "deep", capsys)
    nodes = dict(NODE.findall(text))
    assert len(nodes) <= COLLAPSE_OVER
    modules = {label.split("\\n")[0]: label for label in nodes.values()}
    assert {f"layer{i}" for i in range(120)} <= set(modules)
    assert modules["layer7"] == "layer7\\n3 equations"  # sin, mul, add
    assert not any(n.startswith("e") for n in nodes)  # no equation nodes left
    assert "layer0" in svg_texts(render(text))


def test_names_and_labels_escape_quotes_and_backslashes():
    closed = ir.trace(lambda x: x + 1.0, "f32[2]")
    svg = render(ir.to_dot(closed, name='a "quoted" \\ name'))
    assert "<title>a &quot;quoted&quot; / name</title>" in svg
    text = label("back\\slash", 'say "hi"')
    svg = render("digraph g { n [label=" + text + "]; }")
    assert svg_texts(svg) == ["back\\slash", "say &quot;hi&quot;"]
