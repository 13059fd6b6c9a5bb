"""``mlsys-jax optimize``: before/after tables, rewrites, verification; bad input is one line."""
from __future__ import annotations

import json
import textwrap

import pytest

from mlsys_jax import cli

USER = textwrap.dedent('''
    import numpy as np
    import jax.numpy as jnp
    from mlsys_jax import models

    rng = np.random.default_rng(0)
    C = 8

    def _bn():
        return {k: jnp.asarray(v, jnp.float32) for k, v in (
            ("gamma", 1 + 0.1 * rng.standard_normal(C)), ("beta", 0.1 * rng.standard_normal(C)),
            ("mean", 0.1 * rng.standard_normal(C)), ("var", 1 + 0.1 * rng.random(C)))}

    PARAMS = {"w3": jnp.asarray(rng.standard_normal((C, C, 3, 3)) * 0.1, jnp.float32),
              "w1": jnp.asarray(rng.standard_normal((C, C, 1, 1)) * 0.3, jnp.float32),
              "bn3": _bn(), "bn1": _bn()}

    def block(x):
        return models.resnet_block(PARAMS, x)

    def powers_beside_a_large_region(x):   # a wrong CSE shows in the first half only
        return jnp.concatenate([x ** 2 - x ** 3, x * 1e5])

    def constant(x):                       # a zero-initialised head: the same for every input
        return jnp.zeros((3, 8)) @ x[0, :, 0, :] + 0.5

    def nothing(x):
        return None

    def stateful_rng(x):
        from jax import lax
        return x + lax.rng_uniform(0.0, 1.0, x.shape)

    W16 = jnp.asarray(rng.standard_normal((8, 8, 3, 3)) * 400, jnp.float16)

    def f16_weights_times_200(x):          # float16 weights, float32 accumulation, a scale of 200
        from jax import lax
        z = lax.conv_general_dilated(x.astype(jnp.float16), W16, (1, 1), "SAME",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                     preferred_element_type=jnp.float32)
        return z * jnp.full((1, 8, 1, 1), 200.0)
''')


@pytest.fixture()
def target(tmp_path):
    path = tmp_path / "userblock.py"
    path.write_text(USER)
    return f"{path}:block"


def _json(capsys, argv):
    rc = cli.main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_optimize_json_default_pipeline(target, capsys):
    rc, out = _json(capsys, ["optimize", target, "--arg", "f32[2,8,10,10]", "--json"])
    assert rc == 0 and out["verified"]
    assert out["before"]["kernels"] == 6 and out["after"]["kernels"] == 4
    assert [r["rule"] for r in out["rewrites"]] == ["fold_conv_bn", "fold_conv_bn"]
    assert "3×3 vs 1×1" in out["refusals"][0]["reason"]
    assert out["max_abs_diff"] < 1e-5
    assert out["after"]["primitives"]["conv_general_dilated"] == 2


def test_optimize_search_reaches_two_kernels(target, capsys):
    rc, out = _json(capsys, ["optimize", target, "--arg", "f32[32,8,28,28]", "--search",
                             "--dtype", "bf16", "--json"])
    assert rc == 0 and out["after"]["kernels"] == 2
    assert "enlarge_conv_kernel" in [r["rule"] for r in out["rewrites"]]
    assert out["max_abs_diff"] < 1e-4
    assert [r["rule"] for r in out["search"]["path"]] == [
        "(start)", "pipeline", "enlarge_conv_kernel", "merge_parallel_convs"]


def test_optimize_search_reports_refusals(target, capsys):
    # greedy stops at the pipeline's graph, where the 1×1 still sits beside the 3×3
    rc, out = _json(capsys, ["optimize", target, "--arg", "f32[2,8,10,10]", "--search",
                             "--alpha", "1", "--budget", "5", "--json"])
    assert rc == 0 and out["after"]["kernels"] == 4 and out["search"]["explored"] <= 5
    assert any("3×3 vs 1×1" in r["reason"] for r in out["refusals"])


def test_optimize_text_output(target, capsys):
    assert cli.main(["optimize", target, "--arg", "f32[2,8,10,10]",
                     "--passes", "fold_conv_bn,dce"]) == 0
    text = capsys.readouterr().out
    assert "[before on h100, native dtypes: one kernel per op: 6 kernels" in text
    assert "[after on h100, native dtypes: one kernel per op: 4 kernels" in text
    assert "predicted speedup: one kernel per op ×" in text and "verified: yes" in text


@pytest.mark.parametrize("extra,needle", [
    (["--passes", "dce,bogus"], "unknown pass"),
    (["--passes", ","], "--passes is empty"),
    (["--search", "--alpha", "0.5"], "--alpha"),
    (["--search", "--passes", "dce"], "drop --passes"),
    (["--search", "--budget", "0"], "--budget must be ≥ 1"),
    (["--budget", "3"], "add --search"),
    (["--hw", "tpu9"], "unknown hardware"),
])
def test_optimize_bad_input_is_one_line(target, capsys, extra, needle):
    assert cli.main(["optimize", target, "--arg", "f32[2,8,10,10]", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_optimize_bad_spec_and_target(target, capsys):
    assert cli.main(["optimize", target, "--arg", "f32[2,8,"]) == 2
    assert "malformed shape spec" in capsys.readouterr().err
    assert cli.main(["optimize", target.replace(":block", ":nope"), "--arg", "f32[2]"]) == 2
    assert "no function 'nope'" in capsys.readouterr().err


def test_a_large_region_elsewhere_does_not_hide_a_wrong_rewrite(target, capsys, monkeypatch):
    from mlsys_jax.passes import registry

    monkeypatch.setattr(registry, "pipeline",
                        lambda spec=None, source="": registry.make("cse", param_blind=True))
    rc, out = _json(capsys, ["optimize", target.replace(":block", ":powers_beside_a_large_region"),
                             "--arg", "f32[2,8,10,10]", "--json"])
    assert rc == 1 and out["verdict"] == "no" and out["wrong_elements"] > 0
    assert "beyond atol + rtol·|original|" in out["error"]


def test_a_constant_output_is_not_a_bare_verified_yes(target, capsys):
    assert cli.main(["optimize", target.replace(":block", ":constant"),
                     "--arg", "f32[2,8,10,10]"]) == 1
    text = capsys.readouterr().out
    assert "verified: not established — output 0 is the same on all 3 inputs" in text
    assert "verified: yes" not in text


def test_a_function_without_outputs_is_one_line(target, capsys):
    assert cli.main(["optimize", target.replace(":block", ":nothing"), "--arg", "f32[4]"]) == 2
    err = capsys.readouterr().err.strip()
    assert "returns no outputs" in err and len(err.splitlines()) == 1


def test_stateful_rng_with_no_rewrite_verifies(target, capsys):
    rc, out = _json(capsys, ["optimize", target.replace(":block", ":stateful_rng"),
                             "--arg", "f32[4,8]", "--json"])
    assert rc == 0 and out["verdict"] == "yes" and out["rewrites"] == []


def test_float16_weights_that_would_overflow_are_not_folded(target, capsys):
    rc, out = _json(capsys, ["optimize", target.replace(":block", ":f16_weights_times_200"),
                             "--arg", "f32[2,8,6,6]", "--json"])
    assert rc == 0 and out["verdict"] == "yes"
    assert not [r for r in out["rewrites"] if r["rule"] == "fold_conv_bn"]
    (why,) = [r for r in out["refusals"] if r["rule"] == "fold_conv_bn"]
    assert why["check"] == "weights_fit_dtype" and "overflow float16" in why["reason"]
    assert capsys.readouterr().err == ""  # no NumPy RuntimeWarning leaks
