"""``inspect``'s table per module: rows of every depth sum to the totals, parameters belong to the
modules that read them, flat namespaces are grouped, --depth/--ops/--jaxpr/--json, and the
roofline plot's markers are the table's rows."""
import json
import textwrap

import numpy as np
import pytest

from mlsys_jax import cli
from mlsys_jax.cli.headline import estimates
from mlsys_jax.cli.summary import summarize, weights_of
from mlsys_jax.cli.target import FN_AND_ARGS, Target, load_factory

USER_FILE = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np

    def layer(p, x, name):
        with jax.named_scope(name):
            with jax.named_scope("attn"):
                x = x + jnp.tanh(x @ p["q"]) @ p["o"]
            with jax.named_scope("mlp"):
                return x + jax.nn.relu(x @ p["up"]) @ p["down"]

    def net(p, x):
        x = x @ p["embed"]                       # outside every scope
        with jax.named_scope("net"):
            for i in range(2):
                x = layer(p["blocks"][i], x, f"block{i}")
            with jax.named_scope("head"):
                return x @ p["embed"].T           # tied: read by the root and by head

    def make():
        rng = np.random.default_rng(0)  # NumPy: no compile per shape
        w = lambda *s: jnp.asarray(rng.standard_normal(s) * 0.1, jnp.float32)
        blocks = [{"q": w(16, 16), "o": w(16, 16), "up": w(16, 64), "down": w(64, 16)}
                  for _ in range(2)]
        return net, ({"embed": w(8, 16), "blocks": blocks, "unused": w(3)}, w(4, 8))

    def flat():                                   # a Keras-like flat namespace of 50 layers
        def f(w, x):
            for s in range(5):
                for u in range(5):
                    for op in ("conv", "act"):
                        with jax.named_scope(f"stage{s}_unit{u}_{op}"):
                            x = jnp.tanh(x @ w) if op == "conv" else jax.nn.relu(x)
            return x
        return f, (jnp.eye(8), jnp.ones((2, 8)))

    def long():                                   # more equations than a jaxpr printed by default
        def f(x):
            for _ in range(120):
                x = jnp.sin(x) * 2.0 + 1.0
            return x
        return f, (jnp.ones(4),)
""")

FIGURES = ("flops", "unfused_bytes", "fused_bytes", "unfused_us", "fused_us", "kernels",
           "fused_kernels", "params", "param_bytes")


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "modules_model.py"
    path.write_text(USER_FILE)
    return str(path)


def _summary(user_file, name, hw="h100", depth=None):
    fn, args = load_factory(f"{user_file}:{name}", FN_AND_ARGS)
    user = Target(fn, tuple(args), name, examples=True)
    closed = user.trace()
    both = estimates(closed, hw, None)
    return both, summarize(both, weights_of(user, closed), depth)


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("hw", ["h100", "cpu"])
def test_rows_of_every_depth_sum_to_the_totals(user_file, hw):
    both, s = _summary(user_file, "make", hw)
    node = s.node
    assert node.flops == both.unfused.total_flops == both.fused.total_flops
    assert node.unfused_bytes == both.unfused.total_bytes
    assert node.fused_bytes == both.fused.total_bytes
    assert node.unfused_us == pytest.approx(both.unfused.time_us, rel=1e-12)
    assert node.fused_us == pytest.approx(both.fused.time_us, rel=1e-12)
    assert node.kernels == len(both.unfused.kernels) and node.fused_kernels == len(both.fused.kernels)
    assert s.levels == 3
    for depth in range(1, s.levels + 1):
        _, at = _summary(user_file, "make", hw, depth)
        leaves = at.leaves()
        for name in FIGURES:
            assert sum(getattr(r.cost, name) for r in leaves) == pytest.approx(
                getattr(node, name), rel=1e-12), (depth, name)


def test_parameters_belong_to_the_modules_that_read_them(user_file):
    _, s = _summary(user_file, "make", depth=3)
    rows = {"/".join(r.cost.path): r.cost for r in s.table()}
    block = 16 * 16 * 2 + 16 * 64 * 2
    assert rows["net/block0"].params == rows["net/block1"].params == block
    assert rows["net/block0/attn"].params == 2 * 16 * 16
    assert rows["net/block0/mlp"].params == 2 * 16 * 64
    # the tied embedding is read outside "net" and in net/head: it belongs to the whole program
    assert s.root == () and rows["(unused parameters)"].params == 3
    assert "embed" not in rows and s.node.own.params == 8 * 16
    assert rows["net"].params == 2 * block


def test_text_table_jaxpr_and_depth(user_file, capsys):
    rc, text, _ = _run(capsys, "inspect", f"{user_file}:make")
    assert rc == 0 and "{ lambda" not in text  # the jaxpr only with --jaxpr, however short
    table = text[text.index("[modules"):]
    assert "native dtypes: f32]" in " ".join(table.split())
    for name in ("net", "block0", "attn", "mlp", "head", "(self)", "(unused parameters)"):
        assert f" {name} " in table
    rc, shallow, _ = _run(capsys, "inspect", f"{user_file}:make", "--depth", "1")
    assert rc == 0 and " attn " not in shallow and " net " in shallow
    rc, long, _ = _run(capsys, "inspect", f"{user_file}:long")
    assert rc == 0 and "{ lambda" not in long
    assert "--jaxpr: the jaxpr (360 equations)" in " ".join(long.split())
    rc, shown, _ = _run(capsys, "inspect", f"{user_file}:long", "--jaxpr")
    assert rc == 0 and "{ lambda" in shown
    rc, _, err = _run(capsys, "inspect", f"{user_file}:make", "--depth", "0")
    assert rc == 2 and "--depth must be a positive integer" in err and err.count("\n") == 1


def test_ops_table_and_json_link_kernels_to_modules(user_file, capsys):
    rc, text, _ = _run(capsys, "inspect", f"{user_file}:make", "--ops")
    assert rc == 0 and "[kernels: one kernel per op; h100" in text and "[modules" not in text
    rc, out, _ = _run(capsys, "inspect", f"{user_file}:make", "--json")
    d = json.loads(out)
    assert set(d["total"]) == {"flops", "bytes", "kernels", "time_us", "peak_bytes",
                               "fused_kernels", "fused_time_us", "xla_flops",
                               "xla_bytes_accessed", "xla_argument_bytes", "xla_output_bytes",
                               "xla_temp_bytes", "xla_alias_bytes"}  # ours, then XLA's
    assert {op["module"] for op in d["ops"]} >= {"net/block0/attn", "net/head", "modules_model.py:12"}
    top = [m for m in d["modules"] if m["depth"] == 1]
    assert sum(m["flops"] for m in top) == d["total"]["flops"]
    assert sum(m["unfused_bytes"] for m in top) == d["total"]["bytes"]
    assert sum(m["unfused_us"] for m in top) == pytest.approx(d["total"]["time_us"], rel=1e-12)
    assert sum(m["fused_us"] for m in top) == pytest.approx(d["total"]["fused_time_us"], rel=1e-12)
    assert sum(m["params"] for m in top) == d["params"] == 8 * 16 + 2 * 2560 + 3


@pytest.mark.slow
def test_a_flat_namespace_is_grouped_by_name_prefix(user_file):
    _, s = _summary(user_file, "flat")
    top = s.node.children
    assert sorted(top) == [f"stage{i}_*" for i in range(5)] and all(c.group for c in top.values())
    assert sorted(top["stage2_*"].children) == [f"stage2_unit{u}_*" for u in range(5)]
    assert sorted(top["stage2_*"].children["stage2_unit3_*"].children) == [
        "stage2_unit3_act", "stage2_unit3_conv"]
    assert sum(c.fused_us for c in top.values()) == pytest.approx(s.node.fused_us, rel=1e-12)
    # a loop fusing a unit's conv and act stays in the unit's group (the shared weight is the
    # whole program's)
    assert s.node.own.kernels == s.node.own.fused_kernels == 0 and s.node.own.params == 64


@pytest.mark.slow
def test_plot_markers_are_the_tables_rows(user_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from mlsys_jax.viz.roofline import points_of_rows, roofline

    both, s = _summary(user_file, "make", depth=3)
    leaves = s.leaves()
    points = points_of_rows(leaves, s.default_fused)
    drawn = roofline(str(tmp_path / "r.png"), points, both.unfused.hardware, title="t")
    expected = [(r.cost.flops / r.cost.unfused_bytes, r.cost.flops / (r.cost.unfused_us * 1e-6))
                for r in leaves if r.cost.flops and r.cost.unfused_bytes]
    assert len(expected) >= 6
    np.testing.assert_allclose(np.array(drawn.drawn), np.array(expected), rtol=1e-6)
    assert len(drawn.left_out) == len(leaves) - len(expected)
    out = tmp_path / "cli.png"
    rc, text, _ = _run(capsys, "inspect", f"{user_file}:make", "--plot", str(out))
    assert rc == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"roofline plot written to {out}" in text
