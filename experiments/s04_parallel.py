"""Experiment 04: data, tensor and pipeline parallelism, ZeRO and 3D with jax.shard_map (§5, §7.3-7.4).

Every layout runs as a real SPMD program over simulated CPU devices (the lecture's "GPUs"); the same
code runs unchanged on a multi-device or multi-host mesh. Each parallel step is compared with the
single-device step (loss, gradients, updated parameters), and each collective is read from the
compiled HLO. Demo 3 (pipeline) and 3D come from ``experiments/_s04_pipeline.py``.
"""
from __future__ import annotations

import importlib.util

import jax
import numpy as np
import optax

import experiments
from mlsys_jax import runtime
from mlsys_jax.errors import MlsysError
from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import comm, data, tensor, zero
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.report import Check, Result, format_result, resolve_overrides

ID = "04"
TITLE = "Parallelism: data, tensor, pipeline, ZeRO and 3D on a device mesh (§5, §7.3)"
DEFAULTS = {"batch": 32, "dp_devices": 4, "uneven": (10, 10, 10, 2), "sizes": (16, 32, 4),
            "tp_devices": 4, "tokens": 8, "d_model": 8, "d_hidden": 16, "lr": 0.05,
            "pp_stages": 2, "microbatches": 4, "seed": 0,
            "sections": ("data", "tensor", "pipeline", "3d")}
SECTIONS = ("data", "tensor", "pipeline", "3d")
LECTURE = {"dp_diff": 5.6e-17, "uneven_naive": 0.17, "megatron_diff": 2.2e-15, "wrong_split": 1.20}
TOL = 1e-12  # float64: "equal" to the single-device step (TESTING.md §3 parallel tier)


def run(**overrides) -> Result:
    """Run demos 1-3, ZeRO, 3D and the communication table; layouts that don't fit are skipped."""
    runtime.enable_x64()
    cfg = resolve_overrides(ID, DEFAULTS, overrides)
    unknown = sorted(set(cfg["sections"]) - set(SECTIONS))
    if unknown:
        raise MlsysError(f"experiment 04: unknown section(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(SECTIONS)} (e.g. --set sections=data,pipeline)")
    tables, notes, checks = {}, [], []
    comm_rows = []
    for name, section in (("data", _dp_and_zero_section), ("tensor", _tp_section)):
        if name not in cfg["sections"]:
            continue
        got_tables, got_checks = _or_skip(section, cfg, notes)
        comm_rows += got_tables.pop("_comm", [])
        tables.update(got_tables)
        checks += got_checks
    if importlib.util.find_spec("experiments._s04_pipeline") is not None:
        from experiments import _s04_pipeline as pp

        for name, section, kwargs in (
                ("pipeline", pp.pipeline_section, {"pp_stages": cfg["pp_stages"],
                                                   "microbatches": cfg["microbatches"],
                                                   "devices": jax.devices()}),
                ("3d", pp.threed_section, {"devices": jax.devices()})):
            if name not in cfg["sections"]:
                continue
            got_tables, got_checks = section(**kwargs)
            tables.update(got_tables)
            checks += got_checks
    else:
        notes.append("pipeline and 3D sections: experiments/_s04_pipeline.py not in this checkout")
    if comm_rows:
        tables["communication per step (HLO vs ring formula)"] = comm_rows
        notes.append("ZeRO-1 here all-reduces the gradient (every device keeps the full averaged "
                     "gradient, the Ψ of its formula), so it sends 1.5x DP; ZeRO-2 reduce-scatters "
                     "instead and is back to DP's volume. ZeRO-3 all-gathers the parameters once "
                     "and keeps them for the backward (temp memory), so it also sends what DP "
                     "does, not the paper's 1.5x (which re-gathers in the backward). PP's "
                     "bytes per step: `mlsys-jax bench parallel`.")
    notes.append(f"{jax.device_count()} {jax.devices()[0].platform.upper()} devices; float64; "
                 "collective bytes = per-device bytes sent by a ring algorithm")
    return Result(ID, TITLE, tables, notes, {"checks": checks, "config": cfg})


def _or_skip(section, cfg, notes):
    try:
        return section(cfg)
    except MlsysError as e:  # a layout that does not fit the devices: say so, don't crash
        if "make_mesh" not in str(e):
            raise
        notes.append(f"{section.__name__.strip('_').replace('_', ' ')} skipped: {e}")
        return {}, []


def _dp_and_zero_section(cfg):
    """Demo 1 (§5.1) and ZeRO (§7.3): the DP step, its traps, and ZeRO 1-3 equal to it."""
    n = cfg["dp_devices"]
    if len(cfg["uneven"]) != n or sum(cfg["uneven"]) != cfg["batch"]:
        raise MlsysError(f"experiment 04: uneven={cfg['uneven']} must have dp_devices={n} counts "
                         f"summing to batch={cfg['batch']}")
    mesh = make_mesh({"data": n})
    params, x, y = data.demo_problem(cfg["seed"], cfg["batch"], cfg["sizes"])
    opt = optax.adam(cfg["lr"])
    opt_state = jax.jit(opt.init)(params)  # one compile, not one per eager zeros_like
    ref, _ = _compile_run(data.make_single_step(mlp_loss, opt), params, opt_state, x, y)
    width = max(max(cfg["uneven"]), -(-cfg["batch"] // n))  # one shape: one compile for both
    even = data.pad_shards(x, y, data.even_counts(cfg["batch"], n), width)
    uneven = data.pad_shards(x, y, cfg["uneven"], width)
    dp = data.make_dp_step(mlp_loss, opt, mesh)
    dp_even, dp_compiled = _compile_run(dp.jitted, params, opt_state, *even)
    dp_uneven = dp_compiled(params, opt_state, *uneven)   # same shapes: same executable
    naive, _ = _compile_run(data.dp_grads_fn(mlp_loss, mesh, reduction="mean_of_means"), params,
                            *uneven)
    twice, _ = _compile_run(data.dp_grads_fn(mlp_loss, mesh, reduction="double_psum"), params,
                            *even)
    counts = f"{'/'.join(map(str, data.even_counts(cfg['batch'], n)))}"
    rows = [_step_row(f"even {counts}", "weighted (psum / count)", dp_even, ref, LECTURE["dp_diff"]),
            _step_row("/".join(map(str, cfg["uneven"])), "mean of device means", naive, ref,
                      LECTURE["uneven_naive"]),
            _step_row("/".join(map(str, cfg["uneven"])), "weighted (psum / count)", dp_uneven, ref),
            _step_row(f"even {counts}", "psum of already-summed grad", twice, ref)]
    rows[-1]["grad_ratio"] = _ratio(twice[1], ref[3])
    checks = [Check(f"DP on {n} devices == full batch (loss, grads, params)",
                    rows[0]["worst_diff"] < TOL, rows[0]["worst_diff"], LECTURE["dp_diff"]),
              Check("uneven shards: mean of device means is wrong (grad diff > 0.01)",
                    rows[1]["grad_diff"] > 0.01, rows[1]["grad_diff"], LECTURE["uneven_naive"],
                    note="the size of the naive mean's error depends on the random data and "
                         "model, which differ from the lecture's"),
              Check("uneven shards: count-weighted mean is exact (loss, grads, params)",
                    rows[2]["worst_diff"] < TOL, rows[2]["worst_diff"], f"< {TOL}"),
              Check("grad of a replicated param in shard_map is already summed: psum again = N x",
                    abs(rows[3]["grad_ratio"] - n) < 1e-9, rows[3]["grad_ratio"], n)]
    zero_rows, comm_rows, zero_checks = _zero_rows(params, opt, mesh, even, dp_even, n)
    b = np.dtype(x.dtype).itemsize
    zero_rows.insert(0, _bytes_row("DP", dp_compiled, zero.expected_bytes(
        0, comm.nbytes(params) // b, n, b, opt_state, comm.nbytes(even), b,
        len(jax.tree.leaves(params))), 0.0))
    bad = [r["layout"] for r in zero_rows if r["args_measured"] != r["args_formula"]
           or r["outputs_measured"] != r["outputs_formula"]]
    zero_checks.insert(0, Check(
        "DP, ZeRO 1-3: memory_analysis() per-device argument/output bytes == formulas", not bad,
        bad or [r["model_state"] for r in zero_rows], "Ψ(1+1+2) → Ψ(1+1+2/N) → Ψ(1+3/N) → 4Ψ/N"))
    comm_rows.insert(0, _comm_row("DP", dp_compiled.as_text(), n,
                                  {"all-reduce": comm.nbytes(params) + 2 * b}))  # + loss, count
    return {"demo 1: data parallel (§5.1)": rows, "ZeRO per-device bytes (§7.3)": zero_rows,
            "_comm": comm_rows}, checks + zero_checks


def _zero_rows(params, opt, mesh, batch, dp_out, n):
    """ZeRO 0-3: measured per-device bytes vs formulas, and the step equal to plain DP."""
    xs, ys, ms = data.shard_batch(mesh, "data", *batch)
    rows, comm_rows, checks = [], [], []
    for stage in zero.STAGES[1:]:  # stage 0 = the DP step above, measured there
        zs = zero.make_zero_step(mlp_loss, opt, params, mesh, stage)
        flat, state = zs.init(params)
        out, compiled = _compile_run(zs.step, flat, state, xs, ys, ms)
        hlo = compiled.as_text()
        itemsize = np.dtype(flat.dtype).itemsize
        want = zero.expected_bytes(stage, zs.padded, n, itemsize, state, comm.nbytes(batch),
                                   itemsize)
        psi = zs.n_params  # compare flat vectors on the host (ravel_pytree's leaf order)
        diff = max(abs(float(out[2]) - float(dp_out[2])),
                   data.max_abs_diff(np.asarray(out[0])[:psi], data.flatten(dp_out[0])),
                   data.max_abs_diff(np.asarray(out[3])[:psi], data.flatten(dp_out[3])))
        rows.append(_bytes_row(f"ZeRO-{stage}", compiled, want, diff))
        shard, full, scalars = zs.padded // n * itemsize, zs.padded * itemsize, 2 * itemsize
        expect = {1: {"all-reduce": full + scalars, "all-gather": full},
                  2: {"reduce-scatter": shard, "all-reduce": scalars, "all-gather": full},
                  3: {"all-gather": full, "reduce-scatter": shard, "all-reduce": scalars}}[stage]
        comm_rows.append(_comm_row(f"ZeRO-{stage}", hlo, n, expect))
    worst = max(r["diff_vs_DP"] for r in rows)
    checks = [Check("ZeRO 1-3 step == plain DP step (loss, grads, params)", worst < TOL, worst,
                    f"< {TOL}")]
    return rows, comm_rows, checks


def _bytes_row(layout, compiled, want, diff) -> dict:
    """Per-device bytes: memory_analysis() of the compiled step beside the formulas."""
    ma = compiled.memory_analysis()
    return {"layout": layout, "params": want["params"], "grads": want["grads"],
            "optimizer": want["optimizer"], "model_state": want["model_state"],
            "args_measured": ma.argument_size_in_bytes, "args_formula": want["arguments"],
            "outputs_measured": ma.output_size_in_bytes, "outputs_formula": want["outputs"],
            "diff_vs_DP": diff}


def _tp_section(cfg):
    """Demo 2 (§5.2): column/row splits, Megatron MLP, sequence parallel, the wrong split."""
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
             ("Megatron MLP (column → row)", jax.jit(tensor.megatron_mlp(mesh)), (sharded, x), want,
              {"all-reduce": 1}, LECTURE["megatron_diff"]),
             ("sequence parallel MLP", jax.jit(tensor.sequence_parallel_mlp(mesh)), (sharded, x),
              want, {"all-gather": 1, "reduce-scatter": 1}, None),
             ("wrong split (row first, relu before sum)", jax.jit(tensor.wrong_split_mlp(mesh)),
              (p, x), want, {"all-reduce": 1}, LECTURE["wrong_split"])]
    rows = []
    for name, fn, args, expected, formula, lecture in cases:
        out, compiled = _compile_run(fn, *args)
        counts = comm.collective_counts(compiled.as_text())
        rows.append({"split": name, "max_diff": data.max_abs_diff(out, expected),
                     "lecture": lecture, "hlo_collectives": _fmt_counts(counts),
                     "formula": _fmt_counts(formula), "counts_match": dict(counts) == formula})
    opt = optax.sgd(cfg["lr"])  # Adam is exercised by DP and ZeRO; SGD compiles faster
    target = rng.standard_normal(x.shape)
    state = opt.init(p)
    tp_out, tp_compiled = _compile_run(tensor.make_tp_step(opt, mesh), sharded, state, x, target)
    ref, _ = _compile_run(data.make_single_step(tensor.reference_loss, opt), p, state, x, target)
    step_row = _step_row("Megatron MLP", "TP SGD step vs 1 device", tp_out, ref)
    by = {r["split"]: r for r in rows}
    meg, wrong = by["Megatron MLP (column → row)"], by["wrong split (row first, relu before sum)"]
    checks = [Check("Megatron MLP == unsplit, exactly one all-reduce in its forward HLO",
                    meg["max_diff"] < TOL and meg["hlo_collectives"] == "all-reduce×1",
                    (meg["max_diff"], meg["hlo_collectives"]), LECTURE["megatron_diff"],
                    note="both differences are float64 rounding noise"),
              Check("wrong split (relu before the sum) is wrong (> 0.1)", wrong["max_diff"] > 0.1,
                    wrong["max_diff"], LECTURE["wrong_split"],
                    note="random weights and inputs differ from the lecture's; the split is wrong "
                         "either way"),
              Check("column/row/sequence splits == unsplit, collectives as the formula",
                    all(r["counts_match"] for r in rows) and
                    max(r["max_diff"] for r in rows if r is not wrong) < TOL,
                    max(r["max_diff"] for r in rows if r is not wrong), f"< {TOL}"),
              Check("TP (Megatron) SGD step == single device (loss, grads, params)",
                    step_row["worst_diff"] < TOL, step_row["worst_diff"], f"< {TOL}")]
    comm_row = _comm_row("TP (Megatron step)", tp_compiled.as_text(), n, {"all-reduce": y_bytes})
    comm_row["note"] = f"activation all-reduce {y_bytes} B; hidden {h_bytes} B never moves"
    return {"demo 2: tensor parallel (§5.2)": rows, "TP training step": [step_row],
            "_comm": [comm_row]}, checks


def _compile_run(fn, *args):
    """Compile once, quickly (identical HLO: comm.QUICK_COMPILE), and run."""
    return comm.compile_and_run(fn, *args, options=comm.QUICK_COMPILE)


def _step_row(case, reduction, got, ref, lecture=None) -> dict:
    """Loss / grads / params differences of a (params, state, loss, grads) or (loss, grads) output."""
    loss, grads = (got[2], got[3]) if len(got) == 4 else (got[0], got[1])
    row = {"case": case, "reduction": reduction, "loss_diff": abs(float(loss) - float(ref[2])),
           "grad_diff": data.max_abs_diff(grads, ref[3])}
    if len(got) == 4:
        row["param_diff"] = data.max_abs_diff(got[0], ref[0])
    row["worst_diff"] = max(v for k, v in row.items() if k.endswith("_diff"))
    if lecture is not None:
        row["lecture"] = lecture
    return row


def _ratio(a, b) -> float:
    """Least-squares factor between two gradients: N when psum was applied once too often."""
    u, v = data.flatten(a), data.flatten(b)
    return float(u @ v / (v @ v))


def _comm_row(layout, hlo, n, result_bytes: dict) -> dict:
    """Measured ring bytes of the HLO collectives vs the formula from the collectives' payloads."""
    measured = comm.collectives(hlo, n)
    formula = sum(comm.ring_bytes(k, v, n) for k, v in result_bytes.items())
    got = comm.ring_total(measured)
    return {"layout": layout, "devices": n, "hlo_collectives": _fmt_counts(
        comm.collective_counts(hlo)), "bytes_measured": got, "bytes_formula": formula,
        "match": abs(got - formula) < 1e-6}


def _fmt_counts(counts) -> str:
    return ", ".join(f"{k}×{v}" for k, v in sorted(dict(counts).items()))


def check(result: Result) -> list[Check]:
    """The lecture's claims, tested on the computed data (plus the communication table)."""
    checks = list(result.data.get("checks", []))
    rows = result.tables.get("communication per step (HLO vs ring formula)", [])
    if rows:
        bad = [r["layout"] for r in rows if not r["match"]]
        checks.append(Check("collective bytes in compiled HLO == ring formulas for every layout",
                            not bad, bad or "all match", "formula"))
    return checks


def launch_processes(n: int, overrides: dict, args) -> int:
    """``mlsys-jax run 04 --processes N``: the DP step as N processes, compared with one process."""
    from mlsys_jax.parallel import multiprocess

    total = jax.device_count()
    if n < 2 or total % n:
        raise MlsysError(f"--processes {n}: the {total} devices (--devices) must split evenly into "
                         f">= 2 processes, e.g. --processes 2 --devices {2 * max(total // 2, 1)}")
    settings = {k: v for k, v in resolve_overrides(ID, DEFAULTS, overrides).items()
                if k in multiprocess.SETTINGS}
    settings = {**multiprocess.SETTINGS, **settings}
    many = multiprocess.launch(n, total // n, settings)
    one = multiprocess.run_dp_demo(**settings)
    diff = lambda k: float(np.max(np.abs(np.asarray(many[k]) - np.asarray(one[k]))))
    row = {"layout": f"{n} processes × {total // n} CPU devices (gloo)", "devices": many["devices"],
           "loss_diff": diff("losses"), "grad_diff": diff("grads"), "param_diff": diff("params"),
           "ranks_agree": many["ranks_agree"]}
    worst = max(row["loss_diff"], row["grad_diff"], row["param_diff"])
    result = Result(ID, TITLE + " — multi-process", {"multi-process DP vs one process": [row]},
                    [f"{settings['steps']} Adam steps, batch {settings['batch']}, coordinator on "
                     "127.0.0.1"])
    checks = [Check(f"{n}-process DP == 1-process DP (loss, grads, params)",
                    worst < TOL and many["ranks_agree"], worst, f"< {TOL}")]
    print(format_result(result, checks), flush=True)
    return 0 if all(c.ok for c in checks) else 1


if __name__ == "__main__":
    raise SystemExit(experiments.main([ID]))
