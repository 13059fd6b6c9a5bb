"""Every command on shapes (--abstract, or a factory of ShapeDtypeStructs): the figures equal
those of the same model on arrays, what needs values is refused in one line, and a factory that
reads a value it created is named at its line."""
import json
import os
import textwrap

import pytest

from mlsys_jax import cli
from mlsys_jax.cli.shapes import DISAGREE

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "examples")
LLAMA = f"{EXAMPLES}/flax_llama.py"


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_inspect_on_shapes_equals_inspect_on_arrays(capsys):
    _, on_arrays, _ = run(capsys, "inspect", f"{LLAMA}:inspect_tiny", "--grad", "--xla", "--json")
    code, on_shapes, _ = run(capsys, "inspect", f"{LLAMA}:inspect_tiny", "--grad", "--abstract",
                             "--json")
    arrays, shapes = json.loads(on_arrays), json.loads(on_shapes)
    assert code == 0 and shapes["abstract"] and not arrays["abstract"]
    assert shapes["params"] == arrays["params"] and shapes["total"] == arrays["total"]
    total = shapes["total"]  # at this size elementwise work is a larger share than at 8B (3%)
    assert abs(total["flops"] - total["xla_flops"]) <= DISAGREE * total["xla_flops"]
    assert total["xla_argument_bytes"] >= 4 * shapes["params"]


def test_the_text_says_shapes_first_and_prints_xla_beside_ours(capsys):
    code, out, _ = run(capsys, "inspect", f"{LLAMA}:inspect_tiny", "--abstract")
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith("on shapes only")
    assert any(line.split("|")[0].strip() == "XLA" for line in lines)  # the totals' XLA row


@pytest.mark.slow
def test_shard_on_shapes_equals_the_run_on_arrays(capsys):
    args = ["--mesh", "data=2", "--zero", "3", "--quick-compile", "--json"]
    _, on_arrays, _ = run(capsys, "shard", f"{LLAMA}:train_tiny", "--steps", "1", *args)
    code, on_shapes, _ = run(capsys, "shard", f"{LLAMA}:train_tiny", "--abstract", *args)
    arrays, shapes = json.loads(on_arrays), json.loads(on_shapes)
    assert code == 0 and shapes["abstract"] and not arrays["abstract"]
    assert shapes["executed"] is False and "exact" not in shapes
    assert shapes["per_device"] == arrays["per_device"]
    assert [(r["kind"], r["axis"], r["count"], r["bytes"]) for r in shapes["collectives"]] == \
        [(r["kind"], r["axis"], r["count"], r["bytes"]) for r in arrays["collectives"]]


@pytest.mark.parametrize("argv", [["inspect", f"{LLAMA}:inspect_8b", "--measure"],
                                  ["inspect", f"{LLAMA}:inspect_8b", "--hw", "here"],
                                  ["shard", f"{LLAMA}:train_8b", "--mesh", "data=8",
                                   "--processes", "2"],
                                  ["optimize", f"{LLAMA}:inspect_tiny", "--abstract"]])
def test_what_needs_values_is_refused_in_one_line(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) <= 2 and "shapes only" in err


def test_a_factory_reading_a_value_is_named_at_its_line(capsys, tmp_path):
    path = tmp_path / "reads.py"
    path.write_text(textwrap.dedent("""
        import jax.numpy as jnp, numpy as np
        def make():
            w = jnp.ones((4, 4))
            scale = float(np.asarray(w).max())
            return (lambda w, x: x @ w * scale), (w, jnp.ones((2, 4)))
    """))
    code, _, err = run(capsys, "inspect", f"{path}:make", "--abstract")
    assert code == 2 and "reads.py:5" in err and "jnp instead of NumPy" in err


def test_remat_on_shapes_compiles_what_the_arrays_compile_and_runs_nothing(capsys):
    import jax

    import flax_llama as L

    code, out, _ = run(capsys, "remat", f"{LLAMA}:loss_tiny", "--abstract", "--budget", "100%",
                       "--no-policies", "--json", "--quiet")
    shapes = json.loads(out)
    loss_fn, params, batch = L.loss_tiny()
    on_arrays = jax.jit(jax.grad(loss_fn)).lower(params, batch).compile()
    assert code == 0 and shapes["abstract"] and shapes["step_time_ratio"] is None
    assert shapes["grads_max_abs_diff"] is None and shapes["predicted_step_time_ratio"] == 1.0
    assert shapes["compiled_temp_bytes"] == on_arrays.memory_analysis().temp_size_in_bytes
    assert shapes["compiled_temp_bytes"] <= shapes["budget_bytes"]
