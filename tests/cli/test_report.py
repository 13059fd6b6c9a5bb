"""``optimize``'s report per module (rewrites and refusals where they happened, times before and
after), the search's account of what it explored, and what --measure's speedup is."""
import json
import re
import textwrap

import pytest

from mlsys_jax import cli

USER_FILE = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from jax import lax

    def conv_bn(x, p):
        y = lax.conv_general_dilated(x, p["w"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        with jax.named_scope("bn"):
            return (y - p["mean"]) * lax.rsqrt(p["var"] + 1e-5) * p["gamma"] + p["beta"]

    def net(params, x):
        for i, p in enumerate(params):
            with jax.named_scope(f"block{i}"):
                x = jax.nn.relu(conv_bn(x, p))
        with jax.named_scope("head"):
            return x.mean((1, 2))

    def make():
        rng = np.random.default_rng(0)
        f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
        params = [{"w": f(3, 3, 4, 4) * 0.3, "mean": f(4) * 0.1, "var": 1 + f(4) ** 2,
                   "gamma": 1 + f(4) * 0.1, "beta": f(4) * 0.1} for _ in range(3)]
        return net, (params, f(2, 6, 6, 4))

    def plain():
        return (lambda p, x: jnp.tanh(x @ p)), (jnp.ones((4, 4)), jnp.ones((2, 4)))
""")


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("user") / "convbn_model.py"
    path.write_text(USER_FILE)
    return str(path)


def _run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_rewrites_and_times_per_module(user_file, capsys):
    rc, out, _ = _run(capsys, "optimize", f"{user_file}:make", "--json")
    d = json.loads(out)
    assert rc == 0 and d["verified"]
    folds = [r for r in d["rewrites"] if r["rule"] == "fold_conv_bn"]
    assert sorted(r["module"] for r in folds) == ["block0/bn", "block1/bn", "block2/bn"]
    rows = {"/".join(r["path"]): r for r in d["modules"]}
    for i in range(3):
        assert rows[f"block{i}/bn"]["rewrites"]["fold_conv_bn"] == 1
        block = rows[f"block{i}"]
        assert block["kernels_after"] < block["kernels_before"]
        assert block["after_us"] < block["before_us"]
    blocks = [r for r in d["modules"] if r["depth"] == 1]
    assert sum(r["before_us"] for r in blocks) == pytest.approx(d["before"]["time_us"], rel=1e-12)
    assert sum(r["after_us"] for r in blocks) == pytest.approx(d["after"]["time_us"], rel=1e-12)
    assert sum(sum(r["rewrites"].values()) for r in d["modules"]) == len(d["rewrites"])
    rc, text, _ = _run(capsys, "optimize", f"{user_file}:make", "--hw", "h100")
    table = text[text.index("[per module"):text.index("[rewrites applied")]
    assert rc == 0 and "block1" in table and "fold_conv_bn" not in table  # counts by default
    assert re.search(r"^  fold_conv_bn +\| 3 ", text, re.M)        # one row a rule, counted
    rc, text, _ = _run(capsys, "optimize", f"{user_file}:make", "--hw", "h100", "--ops")
    table = text[text.index("[per module"):]
    assert rc == 0 and "6 fold_constants, 1 fold_conv_bn" in table    # each module's rules


def test_the_search_says_when_there_is_nothing_to_explore(user_file, capsys):
    rc, text, _ = _run(capsys, "optimize", f"{user_file}:plain", "--search")
    assert rc == 0 and "[search: no move applies to the original graph, nothing to explore" in text
    assert "0 of at most" not in text


@pytest.mark.slow
def test_measure_says_its_speedup_is_the_median_of_paired_ratios(user_file, capsys):
    rc, text, _ = _run(capsys, "optimize", f"{user_file}:plain", "--measure", "--rounds", "3")
    line = " ".join(text[text.index("measured here"):].split())
    assert rc == 0 and "(medians); speedup ×" in line
    assert "the median of the 3 rounds' ratios original/optimized [" in line
