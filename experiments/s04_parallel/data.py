"""Experiment 04, demo 1 (§5.1) and ZeRO (§7.3): the data-parallel step, its traps, and ZeRO 1–3
equal to it, with per-device bytes from ``memory_analysis()`` beside the formulas."""
from __future__ import annotations

import jax
import numpy as np
import optax

from experiments.s04_parallel.compare import TOL, comm_row, compile_run, step_row
from mlsys_jax.errors import MlsysError
from mlsys_jax.models import mlp_loss
from mlsys_jax.parallel import comm
from mlsys_jax.parallel.lecture import data, zero
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.results import Check

LECTURE = {"dp_diff": 5.6e-17, "uneven_naive": 0.17}
DP_TABLE, ZERO_TABLE = "demo 1: data parallel (§5.1)", "ZeRO per-device bytes (§7.3)"


def data_section(cfg) -> dict[str, list[dict]]:
    """Demo 1 and ZeRO as tables (and the layouts' communication rows under ``_comm``)."""
    n = cfg["dp_devices"]
    if len(cfg["uneven"]) != n or sum(cfg["uneven"]) != cfg["batch"]:
        raise MlsysError(f"experiment 04: uneven={cfg['uneven']} must have dp_devices={n} counts "
                         f"summing to batch={cfg['batch']}")
    mesh = make_mesh({"data": n})
    params, x, y = data.demo_problem(cfg["seed"], cfg["batch"], cfg["sizes"])
    opt = optax.adam(cfg["lr"])
    opt_state = jax.jit(opt.init)(params)  # one compile, not one per eager zeros_like
    ref, _ = compile_run(data.make_single_step(mlp_loss, opt), params, opt_state, x, y)
    width = max(max(cfg["uneven"]), -(-cfg["batch"] // n))  # one shape: one compile for both
    even = data.pad_shards(x, y, data.even_counts(cfg["batch"], n), width)
    uneven = data.pad_shards(x, y, cfg["uneven"], width)
    dp = data.make_dp_step(mlp_loss, opt, mesh)
    dp_even, dp_compiled = compile_run(dp.jitted, params, opt_state, *even)
    dp_uneven = dp_compiled(params, opt_state, *uneven)   # same shapes: same executable
    naive, _ = compile_run(data.dp_grads_fn(mlp_loss, mesh, reduction="mean_of_means"), params,
                           *uneven)
    twice, _ = compile_run(data.dp_grads_fn(mlp_loss, mesh, reduction="double_psum"), params,
                           *even)
    counts = f"{'/'.join(map(str, data.even_counts(cfg['batch'], n)))}"
    rows = [step_row(f"even {counts}", "weighted (psum / count)", dp_even, ref, LECTURE["dp_diff"]),
            step_row("/".join(map(str, cfg["uneven"])), "mean of device means", naive, ref,
                     LECTURE["uneven_naive"]),
            step_row("/".join(map(str, cfg["uneven"])), "weighted (psum / count)", dp_uneven, ref),
            step_row(f"even {counts}", "psum of already-summed grad", twice, ref)]
    rows[-1]["grad_ratio"] = _ratio(twice[1], ref[3])
    zero_rows, comm_rows = _zero_rows(params, opt, mesh, even, dp_even, n)
    b = np.dtype(x.dtype).itemsize
    zero_rows.insert(0, _bytes_row("DP", dp_compiled, zero.expected_bytes(
        0, comm.nbytes(params) // b, n, b, opt_state, comm.nbytes(even), b,
        len(jax.tree.leaves(params))), 0.0))
    comm_rows.insert(0, comm_row("DP", dp_compiled.as_text(), n,
                                 {"all-reduce": comm.nbytes(params) + 2 * b}))  # + loss, count
    return {DP_TABLE: rows, ZERO_TABLE: zero_rows, "_comm": comm_rows}


def _zero_rows(params, opt, mesh, batch, dp_out, n):
    """ZeRO 1-3: measured per-device bytes vs formulas, and the step's difference from plain DP."""
    xs, ys, ms = data.shard_batch(mesh, "data", *batch)
    rows, comm_rows = [], []
    for stage in zero.STAGES[1:]:  # stage 0 = the DP step, measured by the caller
        zs = zero.make_zero_step(mlp_loss, opt, params, mesh, stage)
        flat, state = zs.init(params)
        out, compiled = compile_run(zs.step, flat, state, xs, ys, ms)
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
        comm_rows.append(comm_row(f"ZeRO-{stage}", hlo, n, expect))
    return rows, comm_rows


def _bytes_row(layout, compiled, want, diff) -> dict:
    """Per-device bytes: memory_analysis() of the compiled step beside the formulas."""
    ma = compiled.memory_analysis()
    return {"layout": layout, "params": want["params"], "grads": want["grads"],
            "optimizer": want["optimizer"], "model_state": want["model_state"],
            "args_measured": ma.argument_size_in_bytes, "args_formula": want["arguments"],
            "outputs_measured": ma.output_size_in_bytes, "outputs_formula": want["outputs"],
            "diff_vs_DP": diff}


def _ratio(a, b) -> float:
    """Least-squares factor between two gradients: N when psum was applied once too often."""
    u, v = data.flatten(a), data.flatten(b)
    return float(u @ v / (v @ v))


def data_checks(tables: dict, n: int) -> list[Check]:
    """§5.1 and §7.3's claims on the demo 1 and ZeRO tables (none if the section did not run)."""
    if DP_TABLE not in tables:
        return []
    rows, zero_rows = tables[DP_TABLE], tables[ZERO_TABLE]
    bad = [r["layout"] for r in zero_rows if r["args_measured"] != r["args_formula"]
           or r["outputs_measured"] != r["outputs_formula"]]
    worst = max(r["diff_vs_DP"] for r in zero_rows if r["layout"] != "DP")
    return [Check(f"DP on {n} devices == full batch (loss, grads, params)",
                  rows[0]["worst_diff"] < TOL, rows[0]["worst_diff"], LECTURE["dp_diff"]),
            Check("uneven shards: mean of device means is wrong (grad diff > 0.01)",
                  rows[1]["grad_diff"] > 0.01, rows[1]["grad_diff"], LECTURE["uneven_naive"],
                  note="the size of the naive mean's error depends on the random data and "
                       "model, which differ from the lecture's"),
            Check("uneven shards: count-weighted mean is exact (loss, grads, params)",
                  rows[2]["worst_diff"] < TOL, rows[2]["worst_diff"], f"< {TOL}"),
            Check("grad of a replicated param in shard_map is already summed: psum again = N x",
                  abs(rows[3]["grad_ratio"] - n) < 1e-9, rows[3]["grad_ratio"], n),
            Check("DP, ZeRO 1-3: memory_analysis() per-device argument/output bytes == formulas",
                  not bad, bad or [r["model_state"] for r in zero_rows],
                  "Ψ(1+1+2) → Ψ(1+1+2/N) → Ψ(1+3/N) → 4Ψ/N"),
            Check("ZeRO 1-3 step == plain DP step (loss, grads, params)", worst < TOL, worst,
                  f"< {TOL}")]
