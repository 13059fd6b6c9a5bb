"""Models at the size they train, on shapes: ``inspect`` and ``shard`` on an 8B Llama-style flax
model and a 1B equinox GPT, each command a process of its own beside a plain JAX process doing
the least the same answer needs (build the abstract model, compile its gradient or its FSDP
step), with wall time and peak RSS of both.

Checks, as figures: parameters equal the analytic count; our FLOPs over XLA's (scan bodies per
trip on both sides); the command's wall over the plain process's; ZeRO-3 over 64 devices holds
12Ψ/64 of parameters and Adam state and 4Ψ/64 of gradients per device (float32), and XLA's
argument bytes equal those of a plain program that splits every parameter 64 ways; on
``data=8,model=8`` the command's own state accounting beside XLA's argument bytes; ``remat
--budget 50%`` on the 8B model whose blocks are not checkpointed: a plan under the budget by
compiled temp bytes, its wall over the plain build+compile of the gradient.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from benchmarks._processes import cli, timed

ROOT = Path(__file__).resolve().parent.parent
NAME = "shapes"
LLAMA, EQX = "examples/flax_llama.py", "examples/equinox_gpt.py"

# argv[1:] as a child; prints its peak RSS in bytes last (os.wait4 charges the child alone)
# the plain gradient, what `inspect --grad` compiles: import the example, build its abstract
# (f, args), compile the gradient of f's summed output w.r.t. args[0] (argv: file, factory)
_PLAIN_GRAD = ("import sys, importlib.util, jax\n"
               "spec = importlib.util.spec_from_file_location('m', sys.argv[1])\n"
               "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
               "f, args = getattr(m, sys.argv[2])()\n"
               "leaves, tree = jax.tree.flatten(args[0])\n"
               "diff = [i for i, x in enumerate(leaves) if hasattr(x, 'dtype')\n"
               "        and jax.numpy.issubdtype(x.dtype, jax.numpy.inexact)]\n"
               "def loss(floats, *rest):\n"
               "    full = list(leaves)\n"
               "    for i, x in zip(diff, floats): full[i] = x\n"
               "    return f(jax.tree.unflatten(tree, full), *rest).sum()\n"
               "c = jax.jit(jax.grad(loss)).lower([leaves[i] for i in diff], *args[1:]).compile()\n"
               "print(c.cost_analysis()['flops'])\n")

# the plain build+compile of a loss's gradient, what `remat` starts from: import the example,
# build its abstract (loss_fn, params, batch), compile jax.grad w.r.t. params (argv: file, factory)
_PLAIN_LOSS_GRAD = ("import sys, importlib.util, jax\n"
                    "spec = importlib.util.spec_from_file_location('m', sys.argv[1])\n"
                    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
                    "loss_fn, params, batch = getattr(m, sys.argv[2])()[:3]\n"
                    "c = jax.jit(jax.grad(loss_fn)).lower(params, batch).compile()\n"
                    "print(c.memory_analysis().temp_size_in_bytes)\n")

# the plain FSDP step: every parameter and Adam leaf split 64 ways on its first dimension that
# 64 divides, the batch over data; argument bytes per device (argv: file, factory, devices)
_PLAIN_FSDP = ("import os, sys, importlib.util\n"
               "n = int(sys.argv[3])\n"
               "os.environ['XLA_FLAGS'] = f'--xla_force_host_platform_device_count={n}'\n"
               "import jax, optax\n"
               "from jax.sharding import NamedSharding, PartitionSpec as P\n"
               "spec = importlib.util.spec_from_file_location('m', sys.argv[1])\n"
               "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
               "loss_fn, params, batch, opt = getattr(m, sys.argv[2])()[:4]\n"
               "mesh = jax.make_mesh((n,), ('data',))\n"
               "def split(x):\n"
               "    for d, size in enumerate(x.shape):\n"
               "        if size % n == 0: return NamedSharding(mesh, P(*[None] * d, 'data'))\n"
               "    return NamedSharding(mesh, P())\n"
               "state = jax.eval_shape(opt.init, params)\n"
               "shard = lambda t: jax.tree.map(split, t)\n"
               "def step(p, s, b):\n"
               "    g = jax.grad(loss_fn)(p, b)\n"
               "    u, s = opt.update(g, s, p)\n"
               "    return optax.apply_updates(p, u), s\n"
               "c = jax.jit(step, in_shardings=(shard(params), shard(state), jax.tree.map(\n"
               "    lambda _: NamedSharding(mesh, P('data')), batch)), donate_argnums=(0, 1)).lower(\n"
               "    params, state, batch).compile()\n"
               "print(c.memory_analysis().argument_size_in_bytes)\n")


def _inspect_figures(file: str, factory: str, count: int) -> dict:
    plain = timed([sys.executable, "-c", _PLAIN_GRAD, file, factory])
    ours = timed(cli("inspect", f"{file}:{factory}", "--grad", "--json"))
    total = json.loads(ours["stdout"])
    figures = {"params_exact": int(total["params"] == count),
               "flops_over_xla_ratio": total["total"]["flops"] / total["total"]["xla_flops"],
               "wall_over_plain_ratio": ours["wall_s"] / plain["wall_s"],
               "wall_s": ours["wall_s"], "plain_wall_s": plain["wall_s"],
               "peak_rss_gb": ours["rss_bytes"] / 1e9}
    return figures


def _shard(factory: str, mesh: str, devices: int) -> tuple[dict, dict]:
    run = timed(cli("--devices", str(devices), "shard", f"{LLAMA}:{factory}", "--mesh", mesh,
                      "--zero", "3", "--json"))
    return json.loads(run["stdout"]), run


def _remat(factory: str, *flags: str) -> dict:
    """``remat --budget 50%`` on the 8B loss whose blocks are not checkpointed, beside the plain
    build+compile of its gradient."""
    plain = timed([sys.executable, "-c", _PLAIN_LOSS_GRAD, LLAMA, factory])
    ours = timed(cli("remat", f"{LLAMA}:{factory}", "--budget", "50%", "--json", *flags))
    plan = json.loads(ours["stdout"])
    return {"plan_temp_over_plain_temp_ratio": plan["compiled_temp_bytes"] / int(plain["stdout"]),
            "plan_under_budget": int(plan["compiled_temp_bytes"] <= plan["budget_bytes"]),
            "predicted_step_time_ratio": plan["predicted_step_time_ratio"],
            "wall_over_plain_ratio": ours["wall_s"] / plain["wall_s"],
            "wall_s": ours["wall_s"], "plain_wall_s": plain["wall_s"],
            "peak_rss_gb": ours["rss_bytes"] / 1e9}


def _gpt2_equal() -> dict:
    """GPT-2 small on arrays and under --abstract: 1 where every figure is equal."""
    gpt2 = "examples/flax_gpt2.py"
    same = {}
    on = [json.loads(timed(cli("inspect", f"{gpt2}:inspect", "--grad", *flag, "--json"))[
        "stdout"]) for flag in (["--xla"], ["--abstract"])]
    same["inspect_params_flops_xla_bytes"] = int(on[0]["params"] == on[1]["params"]
                                                  and on[0]["total"] == on[1]["total"])
    args = ["--mesh", "data=4,model=2", "--zero", "3", "--json"]
    on = [json.loads(timed(cli("shard", f"{gpt2}:train", *flag, *args))["stdout"])
          for flag in (["--steps", "1"], ["--abstract"])]
    rows = lambda report: [(r["kind"], r["axis"], r["count"], r["bytes"])  # noqa: E731
                           for r in report["collectives"]]
    same["shard_per_device_and_collectives"] = int(
        on[0]["per_device"] == on[1]["per_device"] and rows(on[0]) == rows(on[1]))
    return same


def run(quick: bool = False) -> dict:
    sys.path.insert(0, str(ROOT / "examples"))
    import equinox_gpt
    import flax_llama

    # The quick tier: inspect and FSDP's figures on a ~60M Llama over 8 devices (ratios of a
    # kind; the 8B's wall times and RSS, and remat on shapes, are the full tier's).
    size, config, devices = ("small", flax_llama.SMALL, 8) if quick else (
        "8b", flax_llama.LLAMA_8B, 64)
    tag = f"llama{size}" if size == "8b" else f"llama_{size}"
    psi = flax_llama.parameter_count(config)
    figures = {f"{tag}_inspect": _inspect_figures(LLAMA, f"inspect_{size}", psi)}
    if not quick:
        figures["equinox1b_inspect"] = _inspect_figures(
            EQX, "inspect_1b", equinox_gpt.parameter_count(equinox_gpt.GPT_1B))
    fsdp, run64 = _shard(f"train_{size}", f"data={devices}", devices)
    plain = timed([sys.executable, "-c", _PLAIN_FSDP, LLAMA, f"train_{size}", str(devices)])
    d = fsdp["per_device"]
    figures[f"{tag}_fsdp{devices}"] = {
        f"params_and_adam_over_12psi_per_{devices}_ratio":
            (d["param_bytes"] + d["optimizer_bytes"]) / (12 * psi / devices),
        f"grads_over_4psi_per_{devices}_ratio": d["grad_bytes"] / (4 * psi / devices),
        "xla_argument_over_plain_fsdp_ratio": d["xla_argument_bytes"] / int(plain["stdout"]),
        "wall_s": run64["wall_s"], "peak_rss_gb": run64["rss_bytes"] / 1e9,
        "collective_kinds": len([r for r in fsdp["collectives"] if r["count"]])}
    if not quick:
        figures[f"{tag}_remat_50pct"] = _remat(f"loss_{size}_no_remat")
        tp, run88 = _shard("train_8b", "data=8,model=8", 64)
        d = tp["per_device"]
        batch = 2 * 4 * flax_llama.LLAMA_8B.batch * flax_llama.LLAMA_8B.seq // 8  # int32 x2
        figures["llama8b_data8_model8"] = {
            "state_accounting_over_xla_arguments_ratio":
                (d["param_bytes"] + d["optimizer_bytes"] + batch) / d["xla_argument_bytes"],
            "wall_s": run88["wall_s"], "peak_rss_gb": run88["rss_bytes"] / 1e9,
            "collective_kinds": len([r for r in tp["collectives"] if r["count"]])}
        figures["gpt2_small_shapes_equal_arrays"] = _gpt2_equal()
    remat = ("; remat on shapes is the full tier's" if quick else
             ", or compiles the loss's gradient (remat, on the model whose blocks are not "
             "checkpointed: the plan's temp bytes are over that gradient's)")
    notes = [f"Llama-style {size}: {psi:,} parameters, batch {config.batch}×{config.seq} "
             f"tokens" + ("" if quick else "; equinox GPT 1B: "
                         f"{equinox_gpt.parameter_count(equinox_gpt.GPT_1B):,} parameters"),
             "each command is a process of its own beside a plain JAX process that builds the "
             "abstract model and compiles the same gradient (inspect) or an FSDP step splitting "
             f"every leaf {devices} ways (shard){remat}; peak RSS of each process alone",
             f"this machine: {os.cpu_count()} cores"]
    return {"figures": figures, "notes": notes}
