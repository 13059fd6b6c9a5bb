"""The text report of ``mlsys-jax shard`` (at most 120 columns), from its JSON object."""
from __future__ import annotations

from mlsys_jax.tables import fmt, format_table, wrap

QUANTITIES = ("loss", "grads", "params")


def render(target: str, out: dict, devices: int) -> str:
    """Verdict, differences beside noise and bounds, bytes, collectives, the model split."""
    mesh = ",".join(f"{k}={v}" for k, v in out["mesh"].items())
    verdict = exact_verdict(out)
    lines = [wrap(f"{target}: mesh {mesh}, ZeRO-{out['zero']}, {out['steps']} steps ({devices} "
                  "simulated CPU devices)", first=""), "",
             wrap(f"exact: {verdict} - {out['reason']}", first=""), ""]
    diff = [{"": q, f"free-running, {out['steps']} steps": out["max_abs_diff"][q],
             "teacher-forced (decides)": out["teacher_forced"][q],
             "noise (equivalent one-device run)": out["noise"][q],
             "bound (leaf nearest it)": out["bound"][q],
             "its |Δ| / bound": out["bound_ratio"][q]}
            for q in QUANTITIES]
    lines += [format_table(diff, f"max |Δ| against one device (what the mesh computes: "
                                 f"{out['semantics']})"), ""]
    lines += _bytes(out["per_device_bytes"])
    colls = [{"kind": c["kind"], "axis": c["axis"], "count": c["count"], "bytes": _b(c["bytes"]),
              "formula": _b(c["formula_bytes"]), "ratio": c["ratio"],
              "scalars (B)": c["scalar_bytes"], "what": c["what"]} for c in out["collectives"]]
    lines += [format_table(colls, "collectives of the compiled step (ring bytes one device "
                                  "sends; scalars apart)") if colls else
              "collectives: none (one device per axis)", ""]
    lines += _tensor_parallel(out)
    if out["zero_unsplit"]:
        lines.append(wrap("ZeRO keeps these replicated over data (no dimension it divides): "
                          + ", ".join(out["zero_unsplit"]), first=""))
    lines.append(f"step time sharded / one device: {fmt(out['step_time_ratio'])}"
                 if out["step_time_ratio"] is not None else
                 "step time: not measured (--time to measure it)")
    lines += [wrap(f"note: {n}", first="") for n in out["notes"]]
    if "processes" in out:
        pr = out["processes"]
        diffs = ", ".join(f"{q} {fmt(v)}" for q, v in pr["max_abs_diff"].items())
        lines.append(wrap(f"{pr['count']} processes x {pr['devices_per_process']} devices (gloo): "
                          f"{'equal to' if pr['equal'] else 'DIFFERENT from'} one process, step "
                          f"by step (max |Δ| {diffs})", first=""))
    return "\n".join(lines).rstrip()


def exact_verdict(out: dict) -> str:
    """``yes``, ``NO``, or ``NO in general (equal on this batch)``: the report's first word."""
    return ("yes" if out["exact"] else
            "NO in general (equal on this batch)" if out["equal_on_this_batch"]
            and out["semantics"] == "per-shard" else "NO")


def _bytes(b: dict) -> list:
    mem = [{"": k, "measured": _b(b["measured"][k]), "expected": _b(b["expected"].get(k))}
           for k in ("arguments", "outputs", "temp")]
    held = [{"": k, "this layout": _b(b["layout"][k]), "ZeRO formula": _b(b["formula"][k])}
            for k in ("params", "grads", "optimizer", "batch")]
    return [format_table(mem, "per-device bytes (XLA memory_analysis; arguments = params + "
                              "optimizer + batch shard, outputs add grads and loss)"), "",
            format_table(held, "what one device holds"), ""]


def _tensor_parallel(out: dict) -> list:
    tp, lines = out["tensor_parallel"], []
    if tp.get("notice"):
        lines.append(wrap(f"tensor parallel: {tp['notice']}", first=""))
    elif tp["source"] == "derived" and tp["groups"]:
        lines.append(wrap(f"tensor parallel: {len(tp['split'])} parameters split over model, "
                          f"derived from the dataflow ({len(tp['groups'])} Megatron groups):",
                          first=""))
        for g in tp["groups"]:
            bias = f"; with their biases {', '.join(g['bias'])}" if g["bias"] else ""
            lines.append(wrap(f"by output features {', '.join(g['column'])}; by input features "
                              f"{', '.join(g['row'])}{bias}", rest="      "))
    elif out["rules"]:
        how = {"rules": "given", "annotations": "the model's logical axis names, by these "
               "logical axis rules"}
        lines.append(wrap(f"tensor parallel: {len(tp['split'])} parameters split over model, "
                          f"{how.get(tp['source'], tp['source'])}:", first=""))
        lines += [wrap(f"{rx}  ->  {spec}", rest="      ") for rx, spec in out["rules"]]
    if tp.get("replicated") and "model" in out["mesh"]:
        lines.append(wrap(f"{len(tp['replicated'])} parameters stay whole over model:", first=""))
        lines += [wrap(f"{path}: {why}", rest="      ") for path, why in tp["replicated"].items()]
    lines += [wrap(f"note: {n}", first="") for n in tp.get("notes", ())]
    if out["forward_all_reduces"]:
        f = out["forward_all_reduces"]
        lines.append(wrap(f"forward pass all-reduces over model: {f['measured']} (Megatron: "
                          f"{f['megatron']}, one per row-parallel matmul: an attention output or "
                          "MLP down projection)", first=""))
        where = out.get("forward_all_reduce_sources") or {}
        if where:
            lines.append(wrap("  by source: " + ", ".join(f"{k} {v}" for k, v in where.items()),
                              first=""))
    return lines + ([""] if lines else [])


def _b(x) -> str:
    """Bytes with thousands separators (a formula's fraction kept to one decimal)."""
    if x is None:
        return ""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"
