"""Collective bytes per training step for DP, ZeRO-3, TP and PP at a few model sizes (§5, §7.3).

Bytes are read from each layout's compiled HLO (per-device ring bytes, ``mlsys_jax.parallel.comm``)
and set beside the analytical formula; byte counts are deterministic, so each figure is exact
rather than a median. What the analysis says and the figures check:

* DP and ZeRO-3 send ~2Ψ per step: bytes grow with the parameter count Ψ, ZeRO-3 = DP.
* TP (Megatron) sends the activations: bytes grow with tokens × d_model, not with the hidden size.
* PP sends one microbatch activation (and its cotangent) per step: bytes grow with the width,
  not with the number of layers.
* A user's flax transformer under ``mlsys-jax shard`` (``jax.jit`` + ``NamedSharding``): DP,
  ZeRO-1/2/3 and Megatron TP send what the layout's formula says (``parallel/shard/collectives.py``),
  kind by kind.
* The same command's wall time on GPT-2 over a plain ``jax.jit`` + ``NamedSharding`` script of
  the same steps (``shard_gpt2_over_plain``: GPT-2 small; its tiny configuration in ``--quick``;
  ``_shard_speed.py``), and on Keras' EfficientNetV2B0 as shipped, whose training-mode
  BatchNorm makes the loss not separable (``shard_efficientnet_over_plain``, ``--mesh data=2``;
  not in ``--quick``).
* The same command on a GPT-2-small-shaped flax model (``--mesh data=4,model=2 --zero 3``): its
  peak RSS over the training state, and beside it the parts that are no state of the run (the
  sharded step's working memory on all simulated devices, the factory alone), so the peak less
  the programs' memory reads against the states the run keeps (``_shard_memory.py``; not in
  ``--quick``).
"""
from __future__ import annotations

import importlib.util

import jax
import numpy as np
import optax

from pathlib import Path

from benchmarks import building
from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import comm
from mlsys_jax.parallel.lecture import data, tensor, zero
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.schedules import make_schedule
from mlsys_jax.parallel.lecture.pipeline import (mse_loss, pipeline_value_and_grad, tanh_chain_init,
                                             tanh_chain_stage)

NAME = "parallel"
N = 4  # devices per layout (2 when only 2 or 6 are simulated)


def _bytes(fn, *args) -> float:
    hlo = fn.lower(*args).compile(comm.QUICK_COMPILE).as_text()  # same HLO, faster compile
    return comm.ring_total(comm.collectives(hlo, N))


def _dp_and_zero3(hidden: int) -> dict:
    params, x, y = data.demo_problem(0, 16, (16, hidden, 4))
    mesh = make_mesh({"data": N})
    opt = optax.sgd(0.1)
    batch = data.pad_shards(x, y, data.even_counts(16, N))
    psi_bytes = comm.nbytes(params)
    dp = _bytes(data.make_dp_step(mlp_loss, opt, mesh).jitted, params, opt.init(params), *batch)
    zs = zero.make_zero_step(mlp_loss, opt, params, mesh, 3)
    flat, state = zs.init(params)
    z3 = _bytes(zs.step, flat, state, *data.shard_batch(mesh, "data", *batch))
    scalars = comm.ring_bytes("all-reduce", 16, N)                 # loss and sample count
    padded = zs.padded * 8
    return {"psi": psi_bytes // 8, "dp": dp,
            "dp_formula": comm.ring_bytes("all-reduce", psi_bytes + 16, N),
            "zero3": z3, "zero3_formula": comm.ring_bytes("all-gather", padded, N)
            + comm.ring_bytes("reduce-scatter", padded // N, N) + scalars}


def _tp(tokens: int, hidden: int, d_model: int = 8) -> dict:
    mesh = make_mesh({"tensor": N})
    p = tensor.mlp_init(0, d_model, hidden)
    x = np.random.default_rng(0).standard_normal((tokens, d_model))
    step = tensor.make_tp_step(optax.sgd(0.1), mesh)
    got = _bytes(step, tensor.shard_mlp_params(p, mesh), optax.sgd(0.1).init(p), x, x)
    return {"tp": got, "tp_formula": comm.ring_bytes("all-reduce", tokens * d_model * 8, N)}


def _pp(width: int, layers: int, microbatches: int = 4, per_mb: int = 2) -> dict:
    mesh = make_mesh({"pipe": N})
    sched = make_schedule("1f1b", N, microbatches, layers)
    params = tanh_chain_init(np.random.default_rng(0), layers, width, N, np.float64)
    x = np.zeros((microbatches * per_mb, width))
    fn = jax.jit(lambda p, a, b: tuple(pipeline_value_and_grad(
        sched, tanh_chain_stage, mse_loss, p, a, b, mesh))[:2])
    colls = comm.collectives(fn.lower(params, x, x).compile(comm.QUICK_COMPILE).as_text(), N)
    # the permutes sit in the scan over the schedule's steps: each runs once per step
    permutes = sum(c.ring_bytes for c in colls if c.kind == "collective-permute") * sched.steps
    act = per_mb * width * 8
    return {"pp": permutes, "pp_formula": 2 * sched.steps * act, "pp_useful": 2 * microbatches * act}


def _user_transformer(quick: bool) -> dict | None:
    """measured / formula ring bytes of the flax transformer's compiled step, per layout
    (``--quick``: not ZeRO-1 nor data × model)."""
    import sys

    if importlib.util.find_spec("flax") is None:
        return None
    from mlsys_jax.parallel.shard import collectives, step
    from mlsys_jax.parallel.shard.setup import prepare

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    try:
        import flax_transformer
    finally:
        sys.path.pop(0)
    layouts = {"dp": ({"data": N}, 0), "zero1": ({"data": N}, 1), "zero2": ({"data": N}, 2),
               "zero3": ({"data": N}, 3), "tp": ({"model": N}, 0),
               "tp_dp": ({"data": 2, "model": N // 2}, 0)}
    if quick:
        layouts.pop("zero1"), layouts.pop("tp_dp")
    out = {}
    with jax.enable_x64(False):  # users' float32 world
        with building():
            loss_fn, params, batch, opt = flax_transformer.train()
        for name, (mesh, stage) in layouts.items():
            p = prepare(loss_fn, params, batch, opt, mesh, stage)   # separable: the mesh runs p.loss
            hlo = step.compile_sharded(p, p.loss, comm.FAST_COMPILE).as_text()  # collectives
            rows = collectives.table(p.layout, hlo, collectives.formulas(
                p.loss, p.trainable, p.batch, p.layout))
            out[name] = {"measured": sum(r["bytes"] for r in rows),
                         "formula": sum(r["formula_bytes"] for r in rows),
                         "psi": collectives.shard_bytes(p.trainable, p.layout.compute)}
    return out


def _gpt2_small(figures: dict, notes: list) -> None:
    from benchmarks import _shard_memory as sm

    r = sm.gpt2_small_shard_rss()
    g = 2 ** 30
    figures["gpt2_small_shard_rss_over_state_ratio"] = r["peak_rss"] / r["state"]
    # the target's own terms: peak RSS within 4 states plus the programs' working memory
    figures["gpt2_small_shard_rss_less_step_temp_over_state_ratio"] = \
        (r["peak_rss"] - r["step_temp"]) / r["state"]
    figures["gpt2_small_step_temp_over_state_ratio"] = r["step_temp"] / r["state"]
    figures["gpt2_small_factory_rss_over_state_ratio"] = r["factory_rss"] / r["state"]
    notes.append(f"mlsys-jax shard {sm.TARGET} --mesh {sm.MESH} --zero {sm.ZERO} --steps "
                 f"{sm.STEPS} ({r['params'] / 1e6:.1f} M parameters, float32, batch "
                 f"{r['tokens']} tokens; exact: {r['exact']}): peak RSS "
                 f"{r['peak_rss'] / g:.2f} GiB of the whole process (os.wait4) over the "
                 f"one-device training state (params + AdamW state + gradients) "
                 f"{r['state'] / g:.2f} GiB; {r['seconds']:.0f} s")
    notes.append(f"its parts that are no state of the run, measured beside it: the sharded step's "
                 f"working memory {r['step_temp'] / g:.2f} GiB (XLA's temp bytes of one device x "
                 f"{r['devices']} simulated devices, which share this host and run the step at "
                 f"once: step_temp_over_state; rss_less_step_temp_over_state is the peak less it, "
                 f"against the target's 4 states plus the compiled programs' memory), and the "
                 f"factory alone, resident {r['factory_rss'] / g:.2f} GiB once its parameters are "
                 f"computed (Python, JAX, the command's modules, the model and its parameters; "
                 f"its own peak {r['factory_peak'] / g:.2f} GiB; left in the peak, as is the "
                 f"programs' code, which XLA:CPU does not report)")


def _shard_over_plain(figures: dict, notes: list, quick: bool) -> None:
    """``mlsys-jax shard`` on GPT-2 (small; its tiny configuration in ``--quick``) over a plain
    ``NamedSharding`` script of the same steps, whole processes back to back
    (``_shard_speed.py``)."""
    from benchmarks import _shard_speed as ss

    r = ss.over_plain(quick)
    figures["shard_gpt2_over_plain_ratio"] = r["ratio"]
    size = ("GPT-2's tiny configuration: 2 layers, d_model 64, vocabulary 512, sequence 32, "
            "batch 8" if quick else "GPT-2 small, 124 M parameters, sequence 128, batch 8")
    when = "run once, right before it" if quick else "run before and after it"
    mesh = ",".join(f"{k}={v}" for k, v in ss.MESH.items())
    notes.append(f"shard_gpt2_over_plain: mlsys-jax shard {r['target']} --mesh {mesh} --zero "
                 f"{ss.ZERO} --steps {ss.STEPS} ({size}; exact: {r['exact']}, semantics "
                 f"{r['semantics']}) {r['shard_s']:.0f} s, whole process, over a plain jax.jit + "
                 f"NamedSharding script of the same {ss.STEPS} steps on the same layout "
                 f"({when}; {' and '.join(f'{s:.1f}' for s in r['plain_s'])} s, whole process "
                 "less the seconds it spent deriving the layout's specs); no "
                 "--time, so shard runs no timing rounds")
    if quick:
        return
    r = ss.over_plain(quick, target=ss.EFFICIENTNET, mesh={"data": 2}, zero=0)
    figures["shard_efficientnet_over_plain_ratio"] = r["ratio"]
    notes.append(f"shard_efficientnet_over_plain: mlsys-jax shard {r['target']} --mesh data=2 "
                 f"--zero 0 --steps {ss.STEPS} (Keras 3's EfficientNetV2B0 as shipped, 64 px, "
                 f"batch 4, training-mode BatchNormalization; exact: {r['exact']}, semantics "
                 f"{r['semantics']}) {r['shard_s']:.0f} s over the plain script "
                 f"({' and '.join(f'{s:.1f}' for s in r['plain_s'])} s), as above")


def run(quick: bool = False) -> dict:
    global N
    N = 4 if jax.device_count() % 4 == 0 else 2
    if jax.device_count() % N:
        return {"figures": {}, "notes": [f"skipped: needs an even number of devices, "
                                         f"{jax.device_count()} simulated (use --devices 8)"]}
    hiddens = (32, 256) if quick else (32, 128, 512)
    dz = {h: _dp_and_zero3(h) for h in hiddens}
    tp = {h: _tp(8, h) for h in (hiddens[0], hiddens[-1])}
    tp_tokens = _tp(32, hiddens[0])
    pp = {(w, l): _pp(w, l) for w, l in ((8, 4), (8, 16), (32, 4))}
    lo, hi = hiddens[0], hiddens[-1]
    figures = {
        **{f"dp_h{h}_measured_over_formula_ratio": r["dp"] / r["dp_formula"] for h, r in dz.items()},
        **{f"zero3_h{h}_measured_over_formula_ratio": r["zero3"] / r["zero3_formula"]
           for h, r in dz.items()},
        f"dp_bytes_h{hi}_over_h{lo}_ratio": dz[hi]["dp"] / dz[lo]["dp"],
        f"params_h{hi}_over_h{lo}_ratio": dz[hi]["psi"] / dz[lo]["psi"],
        f"zero3_over_dp_h{hi}_ratio": dz[hi]["zero3"] / dz[hi]["dp"],
        **{f"tp_h{h}_measured_over_formula_ratio": r["tp"] / r["tp_formula"] for h, r in tp.items()},
        f"tp_bytes_h{hi}_over_h{lo}_ratio": tp[hi]["tp"] / tp[lo]["tp"],
        "tp_bytes_tokens32_over_tokens8_ratio": tp_tokens["tp"] / tp[lo]["tp"],
    }
    notes = [f"{N} simulated CPU devices per layout, float64, per-device ring bytes per step; "
             "DP/ZeRO-3: MLP (16, h, 4) on batch 16; TP: Megatron MLP d_model 8, 8 tokens"]
    figures.update({f"pp_w{w}_l{l}_measured_over_formula_ratio": r["pp"] / r["pp_formula"]
                    for (w, l), r in pp.items()})
    figures["pp_bytes_layers16_over_layers4_ratio"] = pp[(8, 16)]["pp"] / pp[(8, 4)]["pp"]
    figures["pp_bytes_width32_over_width8_ratio"] = pp[(32, 4)]["pp"] / pp[(8, 4)]["pp"]
    figures["pp_executed_over_useful_ratio"] = pp[(8, 4)]["pp"] / pp[(8, 4)]["pp_useful"]
    notes.append(f"PP: 1F1B, {N} stages, 4 microbatches of 2 rows; the SPMD executor sends on "
                 "every step (idle stages send zeros), so executed/useful = steps/M")
    pipeline = _user_pipeline(quick)
    figures.update(pipeline["figures"])
    notes += pipeline["notes"]
    if not quick and importlib.util.find_spec("flax") is not None:
        _gpt2_small(figures, notes)
    if importlib.util.find_spec("flax") is not None:
        _shard_over_plain(figures, notes, quick)
    user = _user_transformer(quick)
    if user is None:
        notes.append("flax transformer (mlsys-jax shard) skipped: flax is not installed "
                     "(pip install -e '.[ecosystem]')")
        return {"figures": figures, "notes": notes}
    figures.update({f"shard_transformer_{k}_measured_over_formula_ratio": r["measured"] / r["formula"]
                    for k, r in user.items()})
    textbook_zero2 = 2 * comm.ring_bytes("all-gather", user["zero2"]["psi"], N)  # RS + AG
    figures["shard_transformer_zero2_over_textbook_ratio"] = user["zero2"]["measured"] / textbook_zero2
    notes += [f"flax transformer (examples/flax_transformer.py:train, 2 layers, float32) under "
              f"jax.jit + NamedSharding on {N} devices (compiled with comm.FAST_COMPILE: the same "
              "collectives); ring bytes one device sends per step, array "
              "payload (scalars such as the loss and norms apart), against the shard command's formulas: "
              "gradients all-reduced over data (their TP share), ZeRO-split parameters "
              "all-gathered once (stages 1-2 after the update, 3 for the forward), and for TP one "
              "all-reduce of activations per matmul contracting a split dimension (forward) and "
              "per matmul splitting its outputs (backward; flax's q, k, v are three matmuls, so "
              "three where Megatron's fused QKV has one)",
              "ZeRO-2/3 here all-reduce the gradients and keep their slice: XLA:CPU's pipeline "
              "has no reduce-scatter creator (XLA:GPU turns all-reduce + dynamic-slice into a "
              "reduce-scatter), so ZeRO-2 sends all-reduce + all-gather = 1.5x the textbook "
              "reduce-scatter + all-gather (zero2_over_textbook)"]
    return {"figures": figures, "notes": notes}


def _user_pipeline(quick: bool) -> dict:
    """A user's flax transformer (8 blocks; ``--quick``: 4, tiny) as 4 pipeline stages
    (``mlsys_jax.parallel.pipe``): point-to-point bytes and the executed bubble beside their
    formulas, in-flight microbatches, the balance of the split and the teacher-forced exactness,
    per schedule and mesh (``--quick``: 1F1B and GPipe on the pipe axis alone)."""
    import importlib.util
    import sys

    if jax.device_count() % 8 or importlib.util.find_spec("flax") is None:
        return {"figures": {}, "notes": ["pipeline of a user's transformer skipped: needs flax "
                                         "and 8 simulated devices"]}
    from mlsys_jax.parallel.comm import FAST_COMPILE, QUICK_COMPILE
    from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    try:
        import pipeline_stacks
    finally:
        sys.path.pop(0)
    # quick: 4 blocks, one a stage but the ends (still a balance to choose), ~2/3 the compile
    size = dict(layers=4, d_model=16, heads=2, hidden=32, vocab=32, seq=4) if quick else {}
    runs = {"1f1b": ({"pipe": 4}, "1f1b", False), "gpipe": ({"pipe": 4}, "gpipe", False),
            "dp": ({"data": 2, "pipe": 4}, "1f1b", False),
            "remat": ({"pipe": 4}, "1f1b", True)}
    if quick:  # the two schedules of one mesh (they share their one-device references)
        runs.pop("remat"), runs.pop("dp")
    with jax.enable_x64(False):  # users' float32 world
        with building():
            args = pipeline_stacks.transformer(**size)
        # quick: bytes sent, bubbles and values only, which FAST_COMPILE keeps (not the buffers)
        options = FAST_COMPILE if quick else QUICK_COMPILE
        reports = {k: run_pipeline(plan_pipeline(*args, mesh, 8, schedule=sched, remat=remat), 3,
                                   options=options, stage_memory=False)
                   for k, (mesh, sched, remat) in runs.items()}
    figures = {"pp_user_transformer_measured_over_formula_ratio": reports["1f1b"].p2p["ratio"]}
    if "dp" in reports:
        figures["pp_user_transformer_dp_measured_over_formula_ratio"] = reports["dp"].p2p["ratio"]
    for k, r in reports.items():
        figures[f"pp_user_transformer_{k}_executed_bubble_over_formula_ratio"] = float(
            r.bubble["executed"] / r.bubble["formula"])
        worst = max(r.teacher_forced[q]["ratio"] for q in ("loss", "grads", "params"))
        figures[f"pp_user_transformer_{k}_teacher_forced_over_bound_ratio"] = worst
    figures["pp_user_transformer_1f1b_over_gpipe_first_stage_in_flight_ratio"] = (
        reports["1f1b"].in_flight["executed"][0] / reports["gpipe"].in_flight["executed"][0])
    figures["pp_user_transformer_split_slowest_over_mean_ratio"] = \
        reports["1f1b"].balance["max_over_mean"]
    r = reports["1f1b"]
    size_note = ("tiny: d_model 16, 4 blocks" if quick else "its default size, 8 blocks")
    notes = [f"pipeline: examples/pipeline_stacks.py:transformer ({size_note}, "
             f"float32, batch {args[2]['tokens'].shape[0]}) as 4 stages, 8 microbatches, 3 "
             f"AdamW steps, compiled with comm.{'FAST' if quick else 'QUICK'}_COMPILE; split "
             f"{[s['units'] for s in r.stages]}; "
             "point-to-point bytes = compiled collective-permutes x the sends that ran, formula "
             "= boundary activations x M forward + cotangents x M backward; teacher_forced_over"
             "_bound <= 1 means loss, gradients and new parameters equal one device's within "
             "the calibrated noise, every step"]
    if "remat" in reports:  # --remat stashes each stage's inputs instead of the vjp's residuals
        mem = {k: reports[k].memory for k in ("1f1b", "remat")}
        figures["pp_user_transformer_remat_over_saved_stash_row_ratio"] = (
            mem["remat"]["padded"]["stash_row"] / mem["1f1b"]["padded"]["stash_row"])
        figures["pp_user_transformer_remat_over_saved_program_temp_ratio"] = (
            mem["remat"]["program"]["temp"] / mem["1f1b"]["program"]["temp"])
    return {"figures": figures, "notes": notes}
