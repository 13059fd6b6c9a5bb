"""Translation validation of rewrites in bfloat16 and float16 programs: a fold that rounds as the
original does is kept; one that loses precision (folded weights rounded to the weights' narrow
dtype where the original read them exactly and accumulated in float32) is refused with the
measured reason, before it ships — never shipped and then reported ``verified: no``."""
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax import cli
from mlsys_jax import passes as P
from mlsys_jax.passes import registry

RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((2, 8, 12, 12)), jnp.float32)


def _conv(x, w, accumulate):
    return jax.lax.conv_general_dilated(x.astype(w.dtype), w, (1, 1), "SAME",
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                        preferred_element_type=accumulate)


def conv_bn(dtype):
    """Conv + inference BatchNorm, all in ``dtype``: folding rounds as the original does."""
    w = jnp.asarray(RNG.standard_normal((16, 8, 3, 3)) * 0.2, dtype)
    g, b = (jnp.asarray(v, dtype) for v in (1 + 0.3 * RNG.standard_normal(16),
                                             0.1 * RNG.standard_normal(16)))
    mu, var = (jnp.asarray(v, dtype) for v in (0.2 * RNG.standard_normal(16),
                                               0.5 + RNG.random(16)))

    def f(x):
        s = (g * jax.lax.rsqrt(var + jnp.asarray(1e-3, dtype)))[None, :, None, None]
        return jax.nn.relu((_conv(x, w, None) - mu[None, :, None, None]) * s
                           + b[None, :, None, None])
    return f


def accumulated_in_float32(dtype):
    """``dtype`` weights read exactly, the sums in float32, a float32 scale after: folding the
    scale into the weights rounds them to ``dtype``, which the original never does."""
    w = jnp.asarray(RNG.standard_normal((16, 8, 3, 3)) * 0.2, dtype)
    s = jnp.asarray(1 + 0.3 * RNG.standard_normal(16), jnp.float32)

    def f(x):
        return _conv(x, w, jnp.float32) * s[None, :, None, None] + 0.5
    return f


def _folds(f):
    logged = P.run(registry.pipeline(), jax.make_jaxpr(f)(X), verify=True)
    return ([r for r in logged.rewrites if r.rule == "fold_conv_bn"],
            [r for r in logged.refusals if r.rule == "fold_conv_bn"])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_a_fold_that_rounds_as_the_original_is_kept(dtype):
    done, refused = _folds(conv_bn(dtype))
    assert len(done) == 1 and not refused


@pytest.mark.parametrize("dtype, name", [(jnp.bfloat16, "bfloat16"), (jnp.float16, "float16")])
def test_a_fold_that_loses_precision_is_refused_with_the_measured_reason(dtype, name):
    done, refused = _folds(accumulated_in_float32(dtype))
    assert not done and len(refused) == 1
    why = refused[0].reason
    assert refused[0].check == "translation_validation" and f"loses precision in {name}" in why
    ours, original = (float(why.split(" rms")[0].split(" ")[-1]),
                      float(why.split("the original ")[1].split(" rms")[0]))
    assert ours > 100 * original          # measured: bfloat16's rounding against float32's


USER = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np

    rng = np.random.default_rng(0)

    def _model(dtype, accumulate):
        w = jnp.asarray(rng.standard_normal((16, 8, 3, 3)) * 0.2, dtype)
        s = jnp.asarray(1 + 0.3 * rng.standard_normal(16), accumulate or dtype)
        mu = jnp.asarray(0.2 * rng.standard_normal(16), accumulate or dtype)

        def f(params, x):
            w, s, mu = params
            z = jax.lax.conv_general_dilated(x.astype(dtype), w, (1, 1), "SAME",
                                             dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                             preferred_element_type=accumulate)
            return jax.nn.relu((z - mu[None, :, None, None]) * s[None, :, None, None])
        return f, ((w, s, mu), jax.random.normal(jax.random.key(1), (2, 8, 12, 12)))

    def fp16():
        return _model(jnp.float16, None)

    def bf16():
        return _model(jnp.bfloat16, None)

    def bf16_float32_sums():
        return _model(jnp.bfloat16, jnp.float32)

    def fp16_float32_sums():
        return _model(jnp.float16, jnp.float32)
''')


@pytest.mark.parametrize("fn", ["bf16", "fp16", "bf16_float32_sums", "fp16_float32_sums"])
def test_optimize_never_ships_a_fold_it_then_calls_wrong(tmp_path, capsys, fn):
    path = tmp_path / "narrow_convbn.py"
    path.write_text(USER)
    rc = cli.main(["--devices", "8", "optimize", f"{path}:{fn}", "--json"])
    out = json.loads(capsys.readouterr().out)
    folded = [r for r in out["rewrites"] if r["rule"] == "fold_conv_bn"]
    refused = [r for r in out["refusals"] if r["rule"] == "fold_conv_bn"
               and "loses precision" in r["reason"]]
    assert rc == 0 and out["verdict"] != "no", out["error"]
    assert (folded and out["verified"]) or (refused and not folded)
