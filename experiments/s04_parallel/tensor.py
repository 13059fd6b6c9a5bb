"""Experiment 04, demo 2 (§5.2): column and row splits, the Megatron MLP, sequence parallelism and
the wrong split, each against the unsplit MLP, with the collectives read from compiled HLO."""
from __future__ import annotations

import jax
import numpy as np
import optax

from experiments.s04_parallel.compare import TOL, comm_row, compile_run, fmt_counts, step_row
from mlsys_jax.parallel import comm
from mlsys_jax.parallel.lecture import data, tensor
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.results import Check

LECTURE = {"megatron_diff": 2.2e-15, "wrong_split": 1.20}
SPLITS_TABLE, STEP_TABLE = "demo 2: tensor parallel (§5.2)", "TP training step"
MEGATRON, WRONG = "Megatron MLP (column → row)", "wrong split (row first, relu before sum)"


def tensor_section(cfg) -> dict[str, list[dict]]:
    """Demo 2 as tables (and the TP step's communication row under ``_comm``)."""
    n = cfg["tp_devices"]
    mesh = make_mesh({"tensor": n})
    p = tensor.mlp_init(cfg["seed"], cfg["d_model"], cfg["d_hidden"], np.float64)
    rng = np.random.default_rng(cfg["seed"] + 1)
    x = rng.standard_normal((cfg["tokens"], cfg["d_model"]))
    sharded = tensor.shard_mlp_params(p, mesh)
    want = np.maximum(x @ p["w1"] + p["b1"], 0) @ p["w2"] + p["b2"]  # host reference, float64
    b = np.dtype(x.dtype).itemsize
    y_bytes, h_bytes = cfg["tokens"] * cfg["d_model"] * b, cfg["tokens"] * cfg["d_hidden"] * b
    cases = [("column split + all-gather", jax.jit(tensor.column_parallel(mesh)), (x, p["w1"]), x @ p["w1"],
              {"all-gather": 1}, None),
             ("row split + all-reduce", jax.jit(tensor.row_parallel(mesh)), (x, p["w1"]), x @ p["w1"],
              {"all-reduce": 1}, None),
             (MEGATRON, jax.jit(tensor.megatron_mlp(mesh)), (sharded, x), want,
              {"all-reduce": 1}, LECTURE["megatron_diff"]),
             ("sequence parallel MLP", jax.jit(tensor.sequence_parallel_mlp(mesh)), (sharded, x),
              want, {"all-gather": 1, "reduce-scatter": 1}, None),
             (WRONG, jax.jit(tensor.wrong_split_mlp(mesh)), (p, x), want, {"all-reduce": 1},
              LECTURE["wrong_split"])]
    rows = []
    for name, fn, args, expected, formula, lecture in cases:
        out, compiled = compile_run(fn, *args)
        counts = comm.collective_counts(compiled.as_text())
        rows.append({"split": name, "max_diff": data.max_abs_diff(out, expected),
                     "lecture": lecture, "hlo_collectives": fmt_counts(counts),
                     "formula": fmt_counts(formula), "counts_match": dict(counts) == formula})
    opt = optax.sgd(cfg["lr"])  # Adam is exercised by DP and ZeRO; SGD compiles faster
    target = rng.standard_normal(x.shape)
    state = opt.init(p)
    tp_out, tp_compiled = compile_run(tensor.make_tp_step(opt, mesh), sharded, state, x, target)
    ref, _ = compile_run(data.make_single_step(tensor.reference_loss, opt), p, state, x, target)
    step = step_row("Megatron MLP", "TP SGD step vs 1 device", tp_out, ref)
    tp_comm = comm_row("TP (Megatron step)", tp_compiled.as_text(), n, {"all-reduce": y_bytes})
    tp_comm["note"] = f"activation all-reduce {y_bytes} B; hidden {h_bytes} B never moves"
    return {SPLITS_TABLE: rows, STEP_TABLE: [step], "_comm": [tp_comm]}


def tensor_checks(tables: dict) -> list[Check]:
    """§5.2's claims on the demo 2 tables (none if the section did not run)."""
    if SPLITS_TABLE not in tables:
        return []
    rows = tables[SPLITS_TABLE]
    by = {r["split"]: r for r in rows}
    meg, wrong = by[MEGATRON], by[WRONG]
    step = tables[STEP_TABLE][0]
    right = max(r["max_diff"] for r in rows if r is not wrong)
    return [Check("Megatron MLP == unsplit, exactly one all-reduce in its forward HLO",
                  meg["max_diff"] < TOL and meg["hlo_collectives"] == "all-reduce×1",
                  (meg["max_diff"], meg["hlo_collectives"]), LECTURE["megatron_diff"],
                  note="both differences are float64 rounding noise"),
            Check("wrong split (relu before the sum) is wrong (> 0.1)", wrong["max_diff"] > 0.1,
                  wrong["max_diff"], LECTURE["wrong_split"],
                  note="random weights and inputs differ from the lecture's; the split is wrong "
                       "either way"),
            Check("column/row/sequence splits == unsplit, collectives as the formula",
                  all(r["counts_match"] for r in rows) and right < TOL, right, f"< {TOL}"),
            Check("TP (Megatron) SGD step == single device (loss, grads, params)",
                  step["worst_diff"] < TOL, step["worst_diff"], f"< {TOL}")]
