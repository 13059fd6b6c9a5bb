"""``mlsys-jax plan`` end to end on a small GPT-2 (the example's code, one block, narrow) over 8
devices: pure data parallelism refused by its bytes, a layout chosen among compiled ones that fits
and is on the front, validated here (exact, the placed bytes equal the plan's), its file usable by
a user's own ``jax.jit``; and the bad requests, one line each."""
import contextlib
import io
import json
import math
import os
import re
import sys
import textwrap

import jax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from mlsys_jax import cli

pytestmark = pytest.mark.slow   # the plan and the runs behind it: tens of seconds

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "examples")
HERE = os.path.abspath(__file__)
sys.path.insert(0, EXAMPLES)

import flax_gpt2  # noqa: E402  (examples/, on the path above)

# examples/flax_gpt2.py's GPT-2 at one block and a narrow width: the plan's search, its compiles
# and the validation run cost per equation, and none of the claims below depends on depth or width
SMALL = flax_gpt2.ONE_BLOCK
MODEL = f"{HERE}:train_small"


def train_small():
    """The planned factory (``plan`` imports this file for it)."""
    return flax_gpt2.train(SMALL)


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def _param_bytes():
    params = jax.eval_shape(lambda: flax_gpt2.setup(SMALL)[1])   # shapes: nothing initialised
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """One plan of the small GPT-2 with a memory that float32 Adam's state alone (16 bytes a
    parameter) overflows, its layout emitted and validated: (exit status, report, layout file,
    memory). At 14 bytes a parameter pure data parallelism is refused by its bytes and the two
    shortlisted layouts fit as compiled (tighter, the shortlist grows by more compiles).

    ``--microbatches 3`` splits no data shard's 8, 4, 2 or 1 rows, so every pipelined layout is
    refused by its microbatch count and both compiles go to the layouts checked here; a
    pipelined layout compiled on shapes by the plan's own ``_compile_pipeline``, and its layout
    validated, are tests/planning/test_pipelined.py's."""
    path = str(tmp_path_factory.mktemp("plan") / "layout.json")
    memory = 7 * _param_bytes() // 2
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["plan", MODEL, "--devices", "8", "--memory", str(memory),
                         "--shortlist", "2", "--microbatches", "3", "--emit", path, "--validate",
                         "--json", "--quiet"])
    return code, json.loads(out.getvalue()), path, memory


def test_pure_dp_is_refused_and_the_choice_fits_on_the_front(planned):
    code, report, _, memory = planned
    assert code == 0 and report["devices"] == 8 and report["memory_bytes"] == memory
    dp = next(c for c in report["candidates"] if c["mesh"] == {"data": 8, "fsdp": 1, "model": 1,
                                                                "pipe": 1} and c["zero"] == 0)
    assert dp["reason"].startswith("does not fit:")
    best = report["candidates"][report["chosen"]]
    assert best["compiled"] and best["fits"] and best["per_device"]["total_bytes"] <= memory
    assert report["chosen"] in report["pareto"]
    fitting = [c for c in report["candidates"] if c["compiled"] and c["fits"]]
    assert len(fitting) >= 2          # a choice among compiled layouts, not the only one
    assert all(not (c["per_device"]["total_bytes"] < best["per_device"]["total_bytes"]
                    and c["predicted_step_s"] < best["predicted_step_s"])
               for c in fitting)
    assert set(best["per_device"]) >= {"param_bytes", "grad_bytes", "optimizer_bytes",
                                       "xla_argument_bytes", "xla_temp_bytes", "total_bytes"}


def test_validation_is_exact_and_places_the_planned_bytes(planned):
    _, report, _, _ = planned
    v = report["validation"]
    assert v["exact"] and v["bytes_equal"] and v["devices_equal"], v
    assert v["mesh"] == report["layout"]["mesh"]


def test_the_file_feeds_a_users_own_jit(planned):
    _, _, path, _ = planned
    with open(path) as f:
        layout = json.load(f)
    with jax.enable_x64(False):       # a user's program, under JAX's defaults as the plan's
        _users_own_jit(layout)


def _users_own_jit(layout):
    loss_fn, params, batch, _ = train_small()
    # the README's snippet: a user's own shardings from the file
    mesh = jax.make_mesh(tuple(layout["mesh"].values()), tuple(layout["mesh"]))

    def sharding(path, _):
        key = jax.tree_util.keystr(path)
        entries = next(e for rx, e in layout["rules"] if re.search(rx, key))
        return NamedSharding(mesh, P(*[tuple(a) if isinstance(a, list) else a for a in entries]))
    shardings = jax.tree_util.tree_map_with_path(sharding, params)
    grads = jax.jit(jax.grad(loss_fn), in_shardings=(shardings, None))(params, batch)
    assert jax.tree.structure(grads) == jax.tree.structure(params)
    if layout["mesh"].get("model", 1) > 1:    # the tied embedding is split, not replicated
        wte = params["params"]["wte"]["embedding"]
        assert shardings["params"]["wte"]["embedding"].shard_shape(wte.shape) != wte.shape


@pytest.mark.parametrize("argv, match", [
    (["--gpus-per-node", "3"], "not a whole number of nodes"),
    (["--memory", "1KB"], "less than the parameters alone"),
    (["--memory", "lots"], "--memory: expected bytes"),
    (["--shortlist", "0"], "--shortlist must be a positive number"),
    (["--microbatches", "0"], "--microbatches must be a positive number"),
])
def test_bad_requests_get_one_line_and_exit_2(capsys, argv, match):
    code, out, err = run(capsys, "plan", MODEL, "--devices", "8", "--quiet",
                         *argv)
    assert code == 2 and match in err and len(err.strip().splitlines()) <= 2


def test_a_batch_without_a_batch_axis_is_named(capsys, tmp_path):
    f = tmp_path / "nobatch.py"
    f.write_text(textwrap.dedent("""
        import jax.numpy as jnp, optax
        def make():
            return (lambda p, b: jnp.sum(p["w"] * b["x"]), {"w": jnp.ones(4)},
                    {"x": jnp.float32(2.0)}, optax.sgd(0.1))
    """))
    code, _, err = run(capsys, "plan", f"{f}:make", "--devices", "8", "--quiet")
    assert code == 2 and "leading batch axis" in err
