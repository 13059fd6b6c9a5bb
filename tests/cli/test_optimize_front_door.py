"""``optimize`` at the front door: a legitimate Conv+BN fold of a flax model is ``verified: yes``
(the value check's bound from the original's own rounding noise), a deliberately wrong fold is
still ``verified: no``, repeated rewrites are grouped, ``--constants`` names what is folded in,
and the report fits 60 lines of 80 columns."""
import json
import textwrap

import jax
import pytest

from mlsys_jax import cli
from mlsys_jax.passes import value_check

USER_FILE = textwrap.dedent("""
    from functools import partial
    import jax, jax.numpy as jnp
    import flax.linen as nn

    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            bn = partial(nn.BatchNorm, use_running_average=True, epsilon=1e-3)
            for _ in range(2):
                x = nn.relu(bn()(nn.Conv(64, (3, 3), use_bias=False)(x)))
            return nn.Dense(1000)(jnp.mean(x, axis=(1, 2)))

    def _trained(variables):
        # running statistics and scales as after training (examples/inference_nets.py)
        leaves, tree = jax.tree_util.tree_flatten_with_path(variables)
        keys = jax.random.split(jax.random.key(2), len(leaves))
        out = []
        for (path, x), k in zip(leaves, keys):
            name = jax.tree_util.keystr(path)
            if "var" in name or name.endswith("['scale']"):
                x = jax.random.uniform(k, x.shape, x.dtype, 0.5, 1.5)
            elif "mean" in name:
                x = 0.5 * jax.random.normal(k, x.shape, x.dtype)
            out.append(x)
        return jax.tree_util.tree_unflatten(tree, out)

    def conv_bn():
        # logits of size ~100: many cancel to near zero, where float32 rounding is all there is;
        # 32 images, so that some logit where the original is luckily close to float64 turns up
        # whatever CPU XLA compiles for (with 2 images, one AVX-512 host showed none)
        x = 100.0 * jax.random.normal(jax.random.key(1), (32, 8, 8, 3))
        model = Tiny()
        return model.apply, (_trained(model.init(jax.random.key(0), x)), x)

    def scaled(x, table):
        return x @ (table * 2.0 + 1.0)

    def lookup():
        return scaled, (jnp.ones((4, 8)), jnp.linspace(0.0, 1.0, 64).reshape(8, 8))
""")


@pytest.fixture(scope="module")
def user_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("optimize") / "nets.py"
    path.write_text(USER_FILE)
    return str(path)


def _optimize(capsys, *argv, columns=None, monkeypatch=None):
    if columns is not None:
        monkeypatch.setenv("COLUMNS", str(columns))
    with jax.enable_x64(False):
        rc = cli.main(["--devices", "8", "optimize", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.slow
def test_a_conv_bn_fold_is_verified_where_its_rounding_is_the_originals(user_file, capsys,
                                                                        monkeypatch):
    """The shipped ResNet-18's cause, small: at a logit that cancels to near zero, the original
    happens to be closer to its float64 twin than the folded graph, whose rounding is the same
    size (2·|original − r| alone said no). The bound from the original's measured rounding noise
    says yes; the JSON counts the elements it took past the plain tolerance."""
    rc, out, _ = _optimize(capsys, f"{user_file}:conv_bn", columns=80, monkeypatch=monkeypatch)
    assert rc == 0 and "verified: yes" in out
    lines = out.splitlines()  # 20 kernels: the per-kernel tables are shown, 80 columns wide
    assert sum(len(line) <= 80 for line in lines) >= 0.95 * len(lines)
    rc, out, _ = _optimize(capsys, f"{user_file}:conv_bn", "--json")
    data = json.loads(out)
    assert rc == 0 and data["within_twin_bound"] > 0 and data["wrong_elements"] == 0
    assert {r["rule"] for r in data["rewrites"]} >= {"fold_conv_bn"}
    monkeypatch.setattr(value_check, "NOISE_SIGMAS", 0)  # the twin's old bound: 2·|a − r|
    rc, out, _ = _optimize(capsys, f"{user_file}:conv_bn")
    assert rc == 1 and "verified: no" in out


@pytest.mark.slow  # ~5.6 s, the inner loop's longest: the full suite runs it
def test_a_deliberately_wrong_fold_is_still_refuted(user_file, capsys, monkeypatch):
    """Folded weights rounded through bfloat16 (fold_conv_bn's mutant), with translation
    validation off so that only the value check stands between it and the user."""
    import ml_dtypes
    import numpy as np

    from mlsys_jax.passes.rewrite import fold, rule

    real = fold.scale_weights

    def lossy(w, vec, site, dtype):
        out = real(w, vec, site, dtype)
        return out.astype(ml_dtypes.bfloat16).astype(np.float32) \
            if isinstance(out, np.ndarray) and out.dtype == np.float32 else out
    monkeypatch.setattr(fold, "scale_weights", lossy)
    monkeypatch.setattr(rule, "enabled", lambda: False)
    rc, out, _ = _optimize(capsys, f"{user_file}:conv_bn", "--json")
    data = json.loads(out)
    assert rc == 1 and data["verdict"] == "no" and data["wrong_elements"] > 1000
    assert any(r["rule"] == "fold_conv_bn" for r in data["rewrites"])


@pytest.mark.slow
def test_a_fold_without_eps_is_refuted_by_the_value_check():
    """fold_conv_bn's ``conv_bn_no_eps`` mutant (BatchNorm's eps 1e-3 dropped: the scale off by
    ~3e-4 of itself) applied without translation validation: ``no``, and not one of its wrong
    elements is taken for rounding by the float64 twin's bound."""
    from functools import partial

    import flax.linen as nn
    import jax.numpy as jnp

    from mlsys_jax import ir, passes
    from mlsys_jax.passes.rules import fold_conv_bn

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x):
            bn = partial(nn.BatchNorm, use_running_average=True, epsilon=1e-3)
            x = nn.relu(bn()(nn.Conv(32, (3, 3), use_bias=False)(x)))
            return nn.Dense(256)(jnp.mean(x, axis=(1, 2)))
    with jax.enable_x64(False):
        x = 100.0 * jax.random.normal(jax.random.key(1), (2, 8, 8, 3))
        variables = Net().init(jax.random.key(0), x)
        variables = jax.tree_util.tree_map(lambda v: v + 0.5, variables)  # var, scale ≠ 1
        closed = ir.trace(lambda v: Net().apply(variables, v), x)
        mutant = next(m for m in fold_conv_bn.RULE.mutants if m.name == "conv_bn_no_eps")
        wrong = passes.run(mutant.make(), closed, validate=False)
        assert wrong.rewrites
        refuted = value_check.check_values(closed, wrong.jaxpr, [x])
        assert refuted.verdict == "no" and refuted.wrong > 1000 and refuted.within_twin == 0
        right = passes.run(fold_conv_bn.RULE.make_pass(), closed)
        assert right.rewrites
        assert value_check.check_values(closed, right.jaxpr, [x]).verdict == "yes"


def test_repeated_rewrites_are_one_row_per_rule(user_file, capsys):
    rc, out, _ = _optimize(capsys, f"{user_file}:conv_bn", "--json")
    rules = [r["rule"] for r in json.loads(out)["rewrites"]]
    assert rules.count("fold_constants") > 1 and rules.count("fold_conv_bn") == 2
    _, out, _ = _optimize(capsys, f"{user_file}:conv_bn")
    table = out.split("[rewrites applied]")[1].split("\n\n")[0]
    rows = [line.split("|") for line in table.splitlines() if line.strip().startswith("fold_")]
    assert [(r[0].strip(), int(r[1])) for r in rows] == [
        ("fold_constants", rules.count("fold_constants")), ("fold_conv_bn", 2)]
    assert "into conv at N" in table                 # the two folds' positions differ
    _, out, _ = _optimize(capsys, f"{user_file}:conv_bn", "--ops")
    table = out.split("[rewrites applied]")[1].split("\n\n")[0]
    assert sum(line.strip().startswith("fold_constants") for line in table.splitlines()) \
        == rules.count("fold_constants")


def test_constants_names_the_arguments_folded_in(user_file, capsys):
    """``scaled(x, table)``: by default x (the first) is the constant and ``table * 2 + 1`` is
    computed at run time; naming ``table`` (or its index) folds it."""
    def folded(*extra):
        rc, out, _ = _optimize(capsys, f"{user_file}:lookup", "--json", *extra)
        assert rc == 0, out
        return sum(r["rule"] == "fold_constants" for r in json.loads(out)["rewrites"])
    assert folded() == 0
    assert folded("--constants", "table") == folded("--constants", "1") >= 2
    assert folded("--constants", "0") == 0


@pytest.mark.parametrize("spec, message", [
    ("nope", "--constants: 'nope' is not an argument of"),
    ("2", "--constants: argument index 2 is out of range"),
    ("table,", "--constants: an empty entry"),
])
def test_bad_constants_are_one_line(user_file, capsys, spec, message):
    rc, _, err = _optimize(capsys, f"{user_file}:lookup", "--constants", spec)
    lines = [line for line in err.splitlines() if not line.startswith("mlsys-jax: [")]
    assert rc == 2 and len(lines) == 1 and message in lines[0] and "0 x, 1 table" in lines[0]


def test_constants_need_example_values(user_file, capsys):
    rc, _, err = _optimize(capsys, f"{user_file}:scaled", "--arg", "f32[4,8]", "--arg",
                           "f32[8,8]", "--constants", "1")
    assert rc == 2 and "--constants" in err and "example factory" in err


# The shipped flax ResNet-18 (verified, ≤ 60 lines at 80 columns, rewrites grouped) is the
# README's Quickstart command: tests/test_readme.py runs it.
