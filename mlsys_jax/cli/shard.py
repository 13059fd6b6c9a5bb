"""``mlsys-jax shard FILE.py:FN --mesh data=N[,model=M] [--zero 0-3] [--steps S] [--processes P]``
(``--mesh [data=D,]pipe=P``: pipeline stages, ``cli/shard_pipe.py``).

FN is an example factory returning ``(loss_fn, params, batch, optimizer[, rules])``. The user's
step runs S steps sharded (``mlsys_jax.parallel.user_step``) and on one device; the command prints
whether it is exact (and why not), max |Δ| against one device, per-device bytes beside ZeRO's
formula and the collectives beside their formulas. ``--processes P`` also runs the sharded steps
across P local processes (``jax.distributed``, gloo) and compares them with the one-process run.
"""
from __future__ import annotations

import json
import sys

import numpy as np

from mlsys_jax.cli import shard_pipe
from mlsys_jax.cli.target import load_factory as load_factory_as
from mlsys_jax.errors import MlsysError

FORM = "(loss_fn, params, batch, optimizer[, rules])"
HELP = "your training step on a simulated mesh (DP, ZeRO, TP, PP) against one device"


def add_arguments(q) -> None:
    q.add_argument("target", metavar="FILE.py:FN", help=f"a factory returning {FORM}")
    q.add_argument("--mesh", required=True, metavar="data=N[,model=M] | [data=D,]pipe=P",
                   help="mesh axes: data (batch, ZeRO) and model (tensor parallel), or pipe "
                        "(pipeline stages, with data)")
    q.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3),
                   help="ZeRO stage over data (0 = plain data parallel)")
    q.add_argument("--steps", type=int, default=3, help="training steps to compare (default 3)")
    q.add_argument("--processes", type=int, default=1,
                   help="also run across P local processes (jax.distributed)")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    shard_pipe.add_arguments(q)


def parse_mesh(text: str) -> dict:
    """``"data=2,model=2"`` -> ``{"data": 2, "model": 2}`` (one-line errors)."""
    out = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep or not value.strip().isdigit() or int(value) < 1:
            raise MlsysError(f"--mesh: expected data=N[,model=M] with sizes >= 1, got {text!r}")
        out[name.strip()] = int(value)
    return out


def load_factory(target: str) -> tuple:
    """The shared loader (``cli.target.load_factory``), then the optimizer's type:
    ``(loss_fn, params, batch, optimizer, rules)``."""
    import optax

    loss_fn, params, batch, optimizer, rules = load_factory_as(target, FORM)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise MlsysError(f"{target}: the 4th item must be an optax GradientTransformation (e.g. "
                         f"optax.adamw(1e-3)), got {type(optimizer).__name__}")
    return loss_fn, params, batch, optimizer, rules


def _check_devices(mesh: dict, processes: int) -> None:
    import jax

    size, have = int(np.prod(list(mesh.values()))), jax.device_count()
    layout = ",".join(f"{k}={v}" for k, v in mesh.items())
    if have % size:
        raise MlsysError(f"--mesh {layout} uses {size} devices, which does not divide the {have} "
                         f"simulated devices; use --devices {size} (or a multiple) or a mesh "
                         f"whose size divides {have}")
    if processes != 1 and (processes < 2 or size % processes):
        raise MlsysError(f"--processes {processes}: the mesh's {size} devices must split evenly "
                         f"over >= 2 processes; use --processes P with P dividing {size}")


def main(args) -> int:
    import jax

    from mlsys_jax.parallel import comm
    from mlsys_jax.parallel.user_step import simulate

    mesh = parse_mesh(args.mesh)
    shard_pipe.check_flags(args, mesh)
    if "pipe" in mesh:
        return shard_pipe.main(args, mesh)
    if args.steps < 1:
        raise MlsysError(f"--steps must be >= 1, got {args.steps}")
    _check_devices(mesh, args.processes)
    # users' models run under JAX's defaults (float32); the CLI enables float64 for the lecture
    with jax.enable_x64(False):
        loss_fn, params, batch, optimizer, rules = load_factory(args.target)
        report = simulate(loss_fn, params, batch, optimizer, mesh, args.zero, args.steps, rules,
                          options=comm.QUICK_COMPILE)
    out = report.to_json()
    if args.processes > 1:
        out["processes"] = _compare_processes(args, mesh, report)
    print(json.dumps(out, indent=1) if args.json else render(args.target, out, jax.device_count()))
    failed = args.processes > 1 and not out["processes"]["equal"]
    return 1 if failed else 0


def render(target: str, out: dict, devices: int) -> str:
    """The text report (at most 120 columns): verdict, differences, bytes, collectives, rules."""
    from mlsys_jax.tables import fmt, format_table, wrap

    mesh = ",".join(f"{k}={v}" for k, v in out["mesh"].items())
    lines = [wrap(f"{target}: mesh {mesh}, ZeRO-{out['zero']}, {out['steps']} steps ({devices} "
                  "simulated CPU devices)", first=""), "",
             wrap(f"exact: {'yes' if out['exact'] else 'NO'} - {out['reason']}", first=""), ""]
    diff = [{"": q, f"free-running, {out['steps']} steps": out["max_abs_diff"][q],
             "teacher-forced (decides)": out["teacher_forced"][q], "rounding bound": out["bound"][q]}
            for q in ("loss", "grads", "params")]
    lines += [format_table(diff, "max |Δ| against one device"), ""]
    b = out["per_device_bytes"]
    mem = [{"": k, "measured": _b(b["measured"][k]), "expected": _b(b["expected"].get(k))}
           for k in ("arguments", "outputs", "temp")]
    lines += [format_table(mem, "per-device bytes (XLA memory_analysis; arguments = params + "
                                "optimizer + batch shard, outputs add grads and loss)"), ""]
    held = [{"": k, "this layout": _b(b["layout"][k]), "ZeRO formula": _b(b["formula"][k])}
            for k in ("params", "grads", "optimizer", "batch")]
    lines += [format_table(held, "what one device holds"), ""]
    colls = [{"kind": c["kind"], "axis": c["axis"], "count": c["count"], "bytes": _b(c["bytes"]),
              "formula": _b(c["formula_bytes"]), "ratio": c["ratio"],
              "scalars (B)": c["scalar_bytes"], "what": c["what"]} for c in out["collectives"]]
    lines += [format_table(colls, "collectives of the compiled step (ring bytes one device "
                                  "sends; scalars apart)") if colls else
              "collectives: none (one device per axis)", ""]
    if out["rules"]:
        how = "derived by megatron_rules" if out["rules_derived"] else "given"
        lines.append(f"tensor parallel: {len(out['rules'])} partition rules ({how}):")
        lines += [wrap(f"{rx}  ->  {spec}", rest="      ") for rx, spec in out["rules"]]
        if out["replicated_no_rule"]:
            lines.append(wrap(f"{len(out['replicated_no_rule'])} parameters match no rule "
                              f"(replicated): {', '.join(out['replicated_no_rule'])}"))
    if out["forward_all_reduces"]:
        f = out["forward_all_reduces"]
        lines.append(wrap(f"forward pass all-reduces over model: {f['measured']} (Megatron: "
                          f"{f['megatron']}, one per attention output / MLP down projection)",
                          first=""))
    if out["zero_unsplit"]:
        lines.append(wrap("ZeRO keeps these replicated over data (no dimension it divides): "
                          + ", ".join(out["zero_unsplit"]), first=""))
    if out["step_time_ratio"] is not None:
        lines.append(f"step time sharded / one device: {fmt(out['step_time_ratio'])}")
    lines += [wrap(f"note: {n}", first="") for n in out["notes"]]
    if "processes" in out:
        pr = out["processes"]
        diffs = ", ".join(f"{q} {fmt(v)}" for q, v in pr["max_abs_diff"].items())
        lines.append(wrap(f"{pr['count']} processes x {pr['devices_per_process']} devices (gloo): "
                          f"{'equal to' if pr['equal'] else 'DIFFERENT from'} one process, step "
                          f"by step (max |Δ| {diffs})", first=""))
    return "\n".join(lines).rstrip()


def _b(x) -> str:
    """Bytes with thousands separators (a formula's fraction kept to one decimal)."""
    if x is None:
        return ""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _compare_processes(args, mesh: dict, report) -> dict:
    """The same run across P processes: its teacher-forced steps (the same states as this
    process's) must equal this process's within the rounding bound; free-running drift is shown."""
    from mlsys_jax.parallel import multiprocess
    from mlsys_jax.parallel.user_step import QUANTITIES, max_diffs

    size = int(np.prod(list(mesh.values())))
    settings = {"target": args.target, "mesh": mesh, "zero": args.zero, "steps": args.steps}
    many = multiprocess.launch(args.processes, size // args.processes, settings, timeout=600.0,
                               module="mlsys_jax.cli.shard")
    arrays = lambda d: {q: [np.asarray(x) for x in v] for q, v in d.items()}
    one = {k: arrays(_flat(v)) for k, v in report.sharded.items()}
    diff = {k: {q: d for q, (d, _) in max_diffs(arrays(many[k]), one[k]).items()} for k in one}
    return {"count": args.processes, "devices_per_process": size // args.processes,
            "max_abs_diff": diff["forced"], "free_running_diff": diff["free"],
            "ranks_agree": many["ranks_agree"],
            "equal": many["ranks_agree"] and all(
                diff["forced"][q] <= report.bound[q] for q in QUANTITIES)}


def _flat(values: dict) -> dict:
    """Every array of ``{quantity: pytree}`` as a flat float64 list (JSON between processes)."""
    import jax

    return {q: [np.ravel(np.asarray(x, np.float64)).tolist() for x in jax.tree.leaves(v)]
            for q, v in values.items()}


def worker_main(argv=None) -> int:
    """One process of ``--processes P``: the sharded steps on the global mesh, free-running and
    teacher-forced from a one-device reference (each process computes it on its own device)."""
    from mlsys_jax.parallel import multiprocess

    return multiprocess.run_worker(_worker_steps, argv, x64=False)


def _worker_steps(a) -> dict:
    from mlsys_jax.parallel import comm
    from mlsys_jax.parallel.user_plan import plan
    from mlsys_jax.parallel.user_step import one_device, run_sharded, teacher_forced

    cfg = json.loads(a.settings)
    loss_fn, params, batch, optimizer, rules = load_factory(cfg["target"])
    p = plan(loss_fn, params, batch, optimizer, cfg["mesh"], cfg["zero"], rules)
    free, compiled, placed = run_sharded(p, cfg["steps"], comm.QUICK_COMPILE)
    ref = one_device(p, p.same_loss, cfg["steps"], comm.QUICK_COMPILE)
    _, forced = teacher_forced(p, compiled, ref, placed[2])
    free.pop("states")
    return {"free": _flat(free), "forced": _flat(forced)}


if __name__ == "__main__":
    sys.exit(worker_main())
