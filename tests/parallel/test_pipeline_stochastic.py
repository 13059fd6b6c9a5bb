"""The pipeline's verdict on programs that draw random numbers (issue #39 item 3,
``parallel/pipe/stochastic.py``): a dropout MLP whose keys come per example in the batch is
compared with one device drawing the same bits, exactly; one that draws for the whole batch
(one key of the batch, a key without a batch axis, a key fixed inside the loss) is compared with
dropout off when the loss has a ``deterministic`` keyword, else not claimed exact. A pipeline
whose loss is scaled 1.3x, or whose gradients are scaled 1.01x, is NO every time: the bound
never comes from the spread between two random draws.

Float32 throughout (``jax.enable_x64(False)``, as the command runs a user's model).
"""
import contextlib
import io
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mlsys_jax import cli
from mlsys_jax.parallel.comm import FAST_COMPILE
from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline
from mlsys_jax.parallel.pipe.step import PipelinePlan
from mlsys_jax.parallel.pipe.stochastic import off_switch, same_bits_widened, shared_leaves
from mlsys_jax.parallel.pipe.verdict import PipelineVerdict, _as64, judge_step

ROWS, FEATURES, WIDTH, CLASSES, LAYERS = 16, 8, 16, 4, 4

# Runs compile with FAST_COMPILE (parallel/comm.py); the command line's own options are
# exercised by the last test.

MODEL = """
import jax, jax.numpy as jnp, numpy as np, optax

ROWS, FEATURES, WIDTH, CLASSES, LAYERS = 16, 8, 16, 4, 4


def data():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((ROWS, FEATURES)), jnp.float32),
            jnp.asarray(rng.integers(0, CLASSES, ROWS), jnp.int32))


def params():
    rng = np.random.default_rng(1)
    dims = [FEATURES] + [WIDTH] * (LAYERS - 1) + [CLASSES]
    return {f"layer{i}": {"w": jnp.asarray(rng.standard_normal((a, b)) / np.sqrt(a),
                                           jnp.float32), "b": jnp.zeros((b,), jnp.float32)}
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]))}


def dropout(key, h):
    return jnp.where(jax.random.bernoulli(key, 0.5, h.shape), 2 * h, 0.0)


def loss_of(drop):
    def mlp(p, b):
        h = b["x"]
        for i in range(LAYERS):
            with jax.named_scope(f"layer{i}"):
                h = h @ p[f"layer{i}"]["w"] + p[f"layer{i}"]["b"]
                if i < LAYERS - 1:
                    h = drop(b, i, jnp.tanh(h))
        return optax.softmax_cross_entropy_with_integer_labels(h, b["y"]).mean()
    return mlp


def per_example():
    '''One key per example, split with the batch's rows, in both of JAX's forms: raw uint32
    pairs (``PRNGKey``) draw the even layers' masks, typed keys (``jax.random.key``) the odd
    layers'. Every draw follows its row.'''
    x, y = data()
    raw = jax.random.split(jax.random.PRNGKey(7), ROWS)
    typed = jax.random.split(jax.random.key(8), ROWS)
    drop = lambda b, i, h: jax.vmap(lambda k, r: dropout(jax.random.fold_in(k, i), r))(
        b["typed_key" if i % 2 else "key"], h)
    return (loss_of(drop), params(), {"x": x, "y": y, "key": raw, "typed_key": typed},
            optax.adam(1e-2))


def whole_batch(flag=False, single=False):
    '''One key draws the whole batch's masks: the batch's first key, or (``single``) a key
    without a batch axis; ``flag``: the loss takes ``deterministic``.'''
    x, y = data()
    keys = jax.random.key(5) if single else jax.random.split(jax.random.PRNGKey(7), ROWS)
    one = (lambda b: b["key"]) if single else (lambda b: b["key"][0])
    on = loss_of(lambda b, i, h: dropout(jax.random.fold_in(one(b), i), h))
    off = loss_of(lambda b, i, h: h)
    loss = (lambda p, b, deterministic=False: (off if deterministic else on)(p, b)) if flag \\
        else on
    return loss, params(), {"x": x, "y": y, "key": keys}, optax.adam(1e-2)


def whole_batch_flag():
    return whole_batch(flag=True)


def single_key():
    return whole_batch(single=True)


def fixed_key():
    x, y = data()
    drop = lambda b, i, h: dropout(jax.random.fold_in(jax.random.PRNGKey(3), i), h)
    return loss_of(drop), params(), {"x": x, "y": y}, optax.adam(1e-2)
"""
models: dict = {}
exec(compile(MODEL, "<stochastic models>", "exec"), models)  # the factories the CLI loads too


# --- the pieces, without a pipeline --------------------------------------------------------------

def _fast(f, *args):
    """``jax.jit(f)(*args)``, compiled with ``FAST_COMPILE``."""
    return jax.jit(f).lower(*args).compile(FAST_COMPILE)(*args)


@pytest.mark.slow
def test_the_float64_twin_draws_the_float32_programs_bits():
    with jax.enable_x64(False):
        loss, p, b, _ = models["per_example"]()
        v32 = float(_fast(loss, p, b))
    with jax.enable_x64(True):
        twin = float(_fast(same_bits_widened(loss, p, b), _as64(p), _as64(b)))
        retraced = float(_fast(loss, _as64(p), _as64(b)))  # float64 uniforms: other masks
    assert abs(twin - v32) <= 1e-6 * abs(v32)
    assert abs(retraced - v32) > 1e-2 * abs(v32)


@pytest.mark.slow
def test_the_twin_draws_inside_a_scan_with_a_key_in_its_carry():
    def loss(w, b):
        def layer(carry, _):
            h, key = carry
            key, sub = jax.random.split(key)
            return (dropout_(sub, jnp.tanh(h @ w)), key), h.sum()
        (h, _), ys = jax.lax.scan(layer, (b["x"], b["key"][0]), None, length=3)
        return jnp.mean(h ** 2) + 1e-3 * ys.mean()
    dropout_ = models["dropout"]
    w = jnp.asarray(np.random.default_rng(0).standard_normal((4, 4)), jnp.float32)
    b = {"x": jnp.ones((8, 4), jnp.float32), "key": jax.random.split(jax.random.PRNGKey(0), 8)}
    with jax.enable_x64(False):
        v32, g32 = _fast(jax.value_and_grad(loss), w, b)
    with jax.enable_x64(True):
        v64, g64 = _fast(jax.value_and_grad(same_bits_widened(loss, w, b)), _as64(w), _as64(b))
    assert abs(float(v64) - float(v32)) <= 1e-6 * abs(float(v32))
    assert np.max(np.abs(np.asarray(g64) - np.asarray(g32, np.float64))) <= 1e-5 * np.max(
        np.abs(g32))


def test_a_key_without_a_batch_axis_is_read_whole():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    x = jnp.ones((4, 3))
    assert shared_leaves({"x": x, "k": jax.random.key(0)}) == (True, False)
    assert shared_leaves({"x": x, "k": jax.random.PRNGKey(0)}) == (True, False)
    assert shared_leaves({"x": x, "k": keys}) == (False, False)
    assert shared_leaves({"x": x[:2], "k": jax.random.PRNGKey(0)}) == (False, False)  # 2 rows


def test_the_switch_is_a_deterministic_keyword():
    assert off_switch(lambda p, b, deterministic=False: 0.0).keywords == {"deterministic": True}
    assert off_switch(lambda p, b: 0.0) is None
    assert off_switch(max) is None   # no signature to read


def _refs(a_off):
    """Constructed one-device results: B and C the pipeline's draws (2 ulps apart), A the whole
    batch ``a_off`` away (other masks); the twin finds the loss separable."""
    eps, r = float(np.finfo(np.float32).eps), np.random.default_rng(0)
    g = {"w": r.standard_normal((8, 8)).astype(np.float32)}
    upd = lambda grads: {"w": np.float32(0.1) * grads["w"]}  # noqa: E731
    c = {"w": (g["w"] * (1 + 2 * eps)).astype(np.float32)}
    a = {"w": (g["w"] + a_off).astype(np.float32)}
    refs = {k: (np.float32(1.0), x, upd(x), None) for k, x in zip("ABC", (a, g, c))}
    refs["terms"] = (np.float32(1.0), {"w": np.float32(np.abs(g["w"]).max())})
    exact = {"loss": 1.0, "grads": {"w": g["w"].astype(np.float64)}}
    return refs, dict(A64=exact, B64=exact), upd


@pytest.mark.parametrize("factor", [1.0, 1.001])
def test_the_noise_never_holds_another_draw(factor):
    """A whole batch 1e-2 away from its microbatches in float32 (other draws) while the twin
    finds it separable: under the deterministic rule that spread is noise (a 0.1% error passes);
    for a program that draws random numbers it never is (caught)."""
    refs, twin, upd = _refs(1e-2)
    refs.update(twin)
    got = {"w": (refs["B"][1]["w"] * np.float32(factor)).astype(np.float32)}
    verdicts = {}
    for stochastic in (False, True):
        v = PipelineVerdict()
        judge_step(v, refs, {"loss": refs["B"][0], "grads": got, "params": upd(got)}, upd,
                   stochastic=stochastic)
        verdicts[stochastic] = v
    assert verdicts[True].worst["grads"]["noise"] < verdicts[False].worst["grads"]["noise"]
    assert verdicts[True].within("grads") == (factor == 1.0)
    if factor != 1.0:   # the deterministic rule would have let it through
        assert verdicts[False].within("grads")


# --- whole runs ------------------------------------------------------------------------------------

_PLANS: dict = {}


def _plan(name, mesh):
    key = (name, tuple(mesh.items()))
    if key not in _PLANS:
        with jax.enable_x64(False):
            _PLANS[key] = plan_pipeline(*models[name](), mesh, 4, schedule="1f1b")
    return _PLANS[key]


def _run(name, mesh, broken=None, monkeypatch=None, steps=2):
    """The report of ``name`` on ``mesh``; ``broken``: the pipeline's loss (and so its gradients)
    scaled 1.3x ("loss"), or its gradients 1.01x ("grads"), its new parameters what the
    optimizer makes of those: a consistent wrong pipeline."""
    plan = _plan(name, mesh)
    if broken:
        step, factor = PipelinePlan.step, {"loss": 1.3, "grads": 1.01}[broken]

        def off(self, trainable, opt_state, options=None):
            out = step(self, trainable, opt_state, options)
            if broken == "loss":
                out["loss"] = out["loss"] * np.float32(factor)
            out["grads"] = jax.tree.map(lambda g: g * np.float32(factor), out["grads"])
            updates, _ = self.optimizer.update(out["grads"], opt_state, trainable)
            out["params"] = jax.device_get(optax.apply_updates(trainable, updates))
            return out
        monkeypatch.setattr(PipelinePlan, "step", off)
    with jax.enable_x64(False):
        return run_pipeline(plan, steps, options=FAST_COMPILE, stage_memory=False)


@pytest.mark.slow
def test_raw_and_typed_keys_per_example_are_exact_against_the_same_bits():
    r = _run("per_example", {"data": 2, "pipe": 2})
    assert r.exact and r.separable, r.reason
    assert r.reason.startswith("stochastic: the same random bits as one device"), r.reason
    assert r.stochastic["compared_with"] == "the same random bits"
    for q in ("loss", "grads"):   # rounding, not the spread of two draws
        assert r.teacher_forced[q]["bound"] < 1e-5, r.teacher_forced[q]


@pytest.mark.slow
@pytest.mark.parametrize("broken, named", [("loss", "loss"), ("grads", "grads")])
def test_a_wrong_pipeline_with_keys_per_example_is_no(monkeypatch, broken, named):
    r = _run("per_example", {"data": 2, "pipe": 2}, broken, monkeypatch, steps=1)
    assert not r.exact and f"max |Δ{named}|" in r.reason, r.reason
    assert r.reason.startswith("stochastic: the same random bits"), r.reason


@pytest.mark.slow
def test_a_whole_batch_draw_is_compared_with_dropout_off():
    r = _run("whole_batch_flag", {"pipe": 2})
    assert r.exact and not r.separable, r.reason
    assert r.reason.startswith("stochastic: compared with dropout off"), r.reason
    assert "the pipeline computes exactly its microbatches' own draws" in r.reason
    assert r.stochastic["compared_with"] == "dropout off"
    assert r.teacher_forced["grads"]["bound"] < 1e-5   # the dropout-off run's own noise


@pytest.mark.slow
@pytest.mark.parametrize("broken, named", [("loss", "loss"), ("grads", "grads")])
def test_a_wrong_pipeline_compared_with_dropout_off_is_no(monkeypatch, broken, named):
    r = _run("whole_batch_flag", {"pipe": 2}, broken, monkeypatch, steps=1)
    assert not r.exact and r.reason.startswith("stochastic: compared with dropout off"), r.reason
    assert f"max |Δ{named}|" in r.reason, r.reason


@pytest.mark.slow
@pytest.mark.parametrize("name", ["whole_batch", "fixed_key"])
def test_a_whole_batch_draw_without_a_switch_is_not_claimed_exact(name):
    r = _run(name, {"pipe": 2})
    assert not r.exact and not r.separable
    assert r.reason.startswith("stochastic: not claimed exact"), r.reason
    assert "the pipeline computes exactly its microbatches' own draws" in r.reason
    assert r.stochastic["compared_with"] is None


@pytest.mark.slow
def test_a_wrong_pipeline_without_a_switch_says_so(monkeypatch):
    r = _run("whole_batch", {"pipe": 2}, "grads", monkeypatch, steps=1)
    assert not r.exact and "does not compute its microbatches' own draws either" in r.reason


@pytest.mark.slow
def test_one_key_without_a_batch_axis_through_the_command(tmp_path):
    path = tmp_path / "stochastic_models.py"
    path.write_text(textwrap.dedent(MODEL))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = cli.main(["shard", f"{path}:single_key", "--mesh", "data=2,pipe=2",
                         "--microbatches", "4", "--steps", "1", "--json"])
    r = json.loads(out.getvalue())
    assert code == 0 and not r["exact"], r["reason"]
    assert r["reason"].startswith("stochastic: not claimed exact"), r["reason"]
    assert "the pipeline computes exactly its microbatches' own draws" in r["reason"]
