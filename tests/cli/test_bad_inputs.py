"""docs/verification.md §5: every bad input gets one clear error, or the program is left untouched.

Each case goes through the Python API and, where the CLI reaches it, through ``mlsys-jax`` (one
line ``mlsys-jax: error: ...``, non-zero exit, no traceback).
"""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from mlsys_jax import cli, ir, passes
from mlsys_jax.errors import MlsysError
from mlsys_jax.fuzz import Spec
from mlsys_jax.fuzz.program import build
from mlsys_jax.fuzz.judge import check_program
from mlsys_jax.fuzz.opaque import opaque
from mlsys_jax.passes import registry

ALL = registry.instantiate()
PIPELINE = passes.chain(passes.inline(), passes.fold_constants(), passes.cse(),
                        passes.fold_conv_bn(), passes.enlarge_conv_kernel(),
                        passes.merge_parallel_convs(), passes.dce())
DIMS = ("NCHW", "OIHW", "NCHW")


def one_line_error(capsys, argv, needle):
    code = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert code != 0
    assert err.count("\n") == 0 and err.startswith("mlsys-jax: error:"), err
    assert "Traceback" not in err and needle in err, err


def run_all(closed):
    return {n: passes.run(p, closed) for n, p in ALL.items()}


# ---- unknown primitives, wrappers, effects -------------------------------------------------

def test_unknown_primitive_is_opaque():
    c = np.arange(4.0, dtype=np.float32)
    closed = ir.trace(lambda x: opaque(jnp.asarray(c)) + opaque(x) + opaque(x), "f32[4]")
    for name, r in run_all(closed).items():
        counts = ir.primitive_counts(r.jaxpr)
        # never folded (its input is a constant) and never merged (it is not known pure)
        assert counts["fuzz_opaque"] == 3, name


@pytest.mark.parametrize("wrapper", ["jit", "checkpoint", "cond", "scan", "while", "custom_jvp",
                                     "custom_vjp"])
def test_control_flow_and_custom_derivatives_keep_results(wrapper):
    body = [{"op": "pow", "y": 2, "args": [0]}, {"op": "pow", "y": 2, "args": [0]},
            {"op": "binary", "fn": "add", "args": [1, 2]},
            {"op": "scalar", "fn": "mul", "c": 0.5, "args": [3]}]
    node = {"op": wrapper, "args": [0], "body": body, "name": "blk"}
    if wrapper == "checkpoint":
        node["policy"] = "nothing_saveable"
    spec = Spec("dense", "f32", [[4, 8]], [node, {"op": "unary", "fn": "tanh", "args": [1]}], [2])
    out = check_program(spec, ALL, 0)
    assert out.rejected is None and not out.failures, out.failures


def test_effects_are_kept_in_order_and_count():
    spec = Spec("dense", "f32", [[4, 8]], [{"op": "debug", "args": [0]},
                                         {"op": "debug", "args": [0]},
                                         {"op": "unary", "fn": "sin", "args": [1]}], [3])
    closed = build(spec)
    for name, r in run_all(closed).items():
        assert ir.primitive_counts(r.jaxpr)["debug_callback"] == 2, name


def test_symbolic_shapes_are_refused():
    (b,) = jax.export.symbolic_shape("b")
    closed = jax.make_jaxpr(jnp.sin)(jax.ShapeDtypeStruct((b, 8), jnp.float32))
    with pytest.raises(MlsysError, match="symbolic dimension"):
        passes.run(passes.dce(), closed)


# ---- BatchNorm and NaN/Inf-unsafe algebra ----------------------------------------------------

@pytest.mark.parametrize("var,eps", [(-1.0, 1e-5), (0.0, 0.0), (-1e-3, 1e-3)])
def test_bn_with_nonpositive_var_plus_eps_is_left_untouched(var, eps):
    w = np.ones((4, 4, 1, 1), np.float32)
    v = np.full((1, 4, 1, 1), var, np.float32)

    def f(x):
        z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=DIMS)
        return (z - 1.0) * lax.rsqrt(v + eps)
    closed = ir.trace(f, "f32[1,4,3,3]")
    r = passes.run(passes.fold_conv_bn(), closed)
    assert not r.changed
    assert ir.primitive_counts(r.jaxpr)["rsqrt"] == ir.primitive_counts(closed)["rsqrt"]


@pytest.mark.slow
def test_integer_division_is_not_folded_into_an_int32_conv():
    # truncating division is not linear: folding W / 3 made 1,102 of 1,296 outputs wrong
    w = (np.arange(288).reshape(8, 4, 3, 3) % 5 - 2).astype(np.int32)
    x = jnp.asarray(np.arange(648).reshape(2, 4, 9, 9) % 7, jnp.int32)
    closed = ir.trace(lambda x: lax.div(lax.conv(x, w, (1, 1), "SAME"), np.int32(3)), x)
    r = passes.run(passes.chain(passes.fold_conv_bn(), passes.dce()), closed)
    assert not r.changed and "division truncates" in r.refusals[0].reason
    assert np.array_equal(ir.interpret(r.jaxpr, x)[0], ir.interpret(closed, x)[0])


@pytest.mark.parametrize("fn", ["mul0", "sub_self", "div_self"])
def test_nan_unsafe_algebra_keeps_nan_and_inf(fn):
    spec = Spec("dense", "f32", [[4, 8]], [{"op": "nan_unsafe", "fn": fn, "args": [0]}], [1])
    closed = build(spec)
    x = np.zeros((4, 8), np.float32)
    x[0, :3] = [np.inf, -np.inf, np.nan]
    want = np.asarray(ir.interpret(closed, x)[0])
    got = np.asarray(ir.interpret(passes.run(PIPELINE, closed).jaxpr, x)[0])
    assert got.tobytes() == want.tobytes()  # x*0, x-x, x/x are not simplified to 0 or 1


# ---- merge near-misses -----------------------------------------------------------------------

NEAR_MISS = {
    "stride": dict(window_strides=(2, 2)),
    "padding": dict(padding="VALID"),
    "dilation": dict(rhs_dilation=(2, 2)),
    "groups": dict(feature_group_count=2),
    "precision": dict(precision=lax.Precision.HIGHEST),
    "dtype": dict(preferred_element_type=jnp.float64),
}


@pytest.mark.parametrize("attr", sorted(NEAR_MISS))
def test_merge_refuses_convs_that_differ(attr):
    w1 = np.ones((4, 4, 3, 3), np.float32)
    kw = dict(NEAR_MISS[attr])
    w2 = np.ones((4, 2, 3, 3), np.float32) if attr == "groups" else w1 * 2

    def f(x):
        base = dict(window_strides=(1, 1), padding="SAME", dimension_numbers=DIMS)
        a = lax.conv_general_dilated(x, w1, **base)
        b = lax.conv_general_dilated(x, w2, **{**base, **kw})
        if a.shape == b.shape and a.dtype == b.dtype:
            return a + b
        return a, b
    closed = ir.trace(f, "f32[1,4,6,6]")
    r = passes.run(passes.merge_parallel_convs(), closed)
    assert not r.changed, attr
    assert ir.primitive_counts(r.jaxpr)["conv_general_dilated"] == 2


# ---- meshes, pipelines, remat, hardware --------------------------------------------------------

def test_bad_meshes():
    from mlsys_jax.parallel.mesh import make_mesh, require_axes, validate_divisible

    with pytest.raises(MlsysError, match="duplicate"):
        make_mesh((2, 2), ("data", "data"))
    with pytest.raises(MlsysError, match="needs 16 devices"):
        make_mesh({"data": 16})
    with pytest.raises(MlsysError, match="not in the mesh"):
        require_axes(make_mesh({"data": 2}), "model")
    with pytest.raises(MlsysError, match="not divisible"):
        validate_divisible(10, 4, "batch")


@pytest.mark.parametrize("stages,micro,layers", [(0, 4, None), (2, 0, None), (4, 2, 3)])
def test_bad_pipeline_counts(stages, micro, layers):
    from mlsys_jax.parallel.schedules import gpipe, one_f_one_b

    for make in (gpipe, one_f_one_b):
        with pytest.raises(MlsysError):
            make(stages, micro, layers)


@pytest.mark.parametrize("k", [0, -1, 9])
def test_bad_remat_k(k):
    from mlsys_jax.remat import every_k

    with pytest.raises(MlsysError, match="1 <= k <= n"):
        every_k(8, k)


def test_unknown_hardware(capsys, tmp_path):
    from mlsys_jax.cost.hardware import get_hardware

    with pytest.raises(MlsysError, match="unknown hardware"):
        get_hardware("tpu9000")
    one_line_error(capsys, ["inspect", _target(tmp_path), "--arg", "f32[3]", "--hw", "tpu9000"],
                   "unknown hardware")


# ---- the CLI -----------------------------------------------------------------------------------

def _target(tmp_path) -> str:
    f = tmp_path / "prog.py"
    f.write_text("import jax.numpy as jnp\n\ndef f(x):\n    return jnp.sin(x) * 2.0\n")
    return f"{f}:f"


@pytest.mark.parametrize("spec", ["f32[3,,4]", "f32(3)", "foo[3]", "f32[a]", "[3]"])
@pytest.mark.parametrize("command", ["inspect", "optimize"])
def test_malformed_shape_strings(capsys, tmp_path, command, spec):
    one_line_error(capsys, [command, _target(tmp_path), "--arg", spec], "")


@pytest.mark.parametrize("argv,needle", [
    (["fuzz", "--programs", "0"], "--programs"),
    (["fuzz", "--programs", "3", "--passes", "cse,bogus"], "unknown pass"),
    (["fuzz", "--time-budget", "-1"], "--time-budget"),
    (["fuzz", "--seed", "-2"], "--seed"),
])
def test_fuzz_cli_errors(capsys, argv, needle):
    one_line_error(capsys, argv, needle)


@pytest.mark.parametrize("argv,needle", [
    (["run", "04", "--set", "pp_stages=0", "--set", "sections=pipeline"], "pp_stages"),
    (["run", "04", "--set", "microbatches=0", "--set", "sections=pipeline"], "microbatches"),
    (["run", "04", "--set", "dp_devices=3", "--set", "sections=data"], "dp_devices=3"),
    (["run", "03", "--set", "ks=0", "--set", "jax=false"], "1 <= K <= n_layers"),
    (["run", "03", "--set", "ks=65", "--set", "jax=false"], "1 <= K <= n_layers"),
    (["run", "99"], "99"),
])
def test_schedule_and_layout_cli_errors(capsys, argv, needle):
    one_line_error(capsys, argv, needle)


def test_fuzz_api_errors():
    from mlsys_jax.fuzz.campaign import run_campaign

    with pytest.raises(MlsysError, match="unknown pass"):
        run_campaign(3, passes="cse,nope")
    with pytest.raises(MlsysError, match="positive"):
        run_campaign(0)
    assert tuple(registry.instantiate()) == registry.NAMES


@pytest.mark.slow
def test_cli_error_is_one_line_in_a_real_process(tmp_path):
    """The contract end to end: a subprocess, stderr one line, exit 2, no traceback."""
    p = subprocess.run([sys.executable, "-m", "mlsys_jax.cli", "--devices", "1", "optimize",
                        _target(tmp_path), "--arg", "f32[3,,4]"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlsys-jax: error:"), p.stderr
    assert "Traceback" not in p.stderr
