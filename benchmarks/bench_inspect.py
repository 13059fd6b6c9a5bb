"""``inspect`` and ``optimize`` at the size of real models: memory proportional to the parameters,
time beside ``inspect``'s, and tables a person reads.

1. Each command runs in a fresh process on a factory whose parameters hold one 512 MiB array
   (``benchmarks/_big_params.py``: a dense layer, and a 1×1 conv + BatchNorm that
   ``fold_conv_bn`` rewrites into a new 512 MiB kernel); its peak RSS (``wait4``'s
   ``ru_maxrss``) over the parameters' bytes, beside the factory run alone, and ``optimize``'s
   wall time over ``inspect``'s in paired, alternating rounds (median of per-round ratios).
2. The same ``optimize`` at 4 GiB of parameters: it runs, or is refused before any work with the
   estimate (only where the machine has room to try).
3. Real sizes: flax ResNet-50 at 224 px (batch 1) and GPT-2 small, ``inspect --hw h100``: lines
   of the default output, the largest relative difference between the top rows' sums and the
   totals, and (GPT-2) the blocks with attention and MLP rows and the unembedding's FLOPs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from mlsys_jax import runtime

NAME = "inspect"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FACTORIES = os.path.join(ROOT, "benchmarks", "_big_params.py")
EXAMPLES = os.path.join(ROOT, "examples")
MIB = 1 << 20
MODELS = ("dense", "conv_bn", "elementwise")  # elementwise: fold_constants makes a 512 MiB copy


def _child(argv: list[str]) -> dict:
    """Run ``python argv...`` in a fresh process: seconds, peak RSS bytes, exit status, stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], stdout=out, stderr=err, env=env,
                                cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {"seconds": seconds, "rss": usage.ru_maxrss * 1024, "rc": proc.returncode,
                "out": out.read(), "err": err.read()}


def _cli(*argv: str) -> dict:
    return _child(["-m", "mlsys_jax.cli", *argv])


def _memory_and_time(factory: str, param_bytes: int, rounds: int) -> tuple[dict, list[str]]:
    target = f"{FACTORIES}:{factory}"
    alone = _child(["-m", "benchmarks._big_params", factory])
    runs = {"inspect": [], "optimize": []}
    for _ in range(rounds):  # alternating, so both see the same machine
        for command in runs:
            r = _cli(command, target, "--hw", "cpu")
            if r["rc"] != 0:
                raise RuntimeError(f"{command} {factory} failed: {r['err'][-500:]}")
            runs[command].append(r)
    ratios = sorted(o["seconds"] / i["seconds"] for i, o in zip(runs["inspect"], runs["optimize"]))
    peak = {c: max(r["rss"] for r in rs) for c, rs in runs.items()}
    figures = {"factory_rss_over_param_bytes_ratio": alone["rss"] / param_bytes,
               "inspect_rss_over_param_bytes_ratio": peak["inspect"] / param_bytes,
               "optimize_rss_over_param_bytes_ratio": peak["optimize"] / param_bytes,
               "optimize_peak_rss_gb": peak["optimize"] / 1e9,
               # the target: a bare process plus 4× the parameters (the parameters, a folded
               # copy, two outputs of their size), i.e. the factory alone plus 3×; ≤ 1 meets it
               "optimize_rss_over_target_ratio": peak["optimize"] / (alone["rss"]
                                                                    + 3 * param_bytes),
               "optimize_rss_over_factory_rss_ratio": peak["optimize"] / alone["rss"],
               "optimize_over_inspect_time_ratio": {"ratio": ratios[len(ratios) // 2],
                                                    "min": ratios[0], "max": ratios[-1]},
               "optimize_seconds": sorted(r["seconds"] for r in runs["optimize"])[rounds // 2]}
    return figures, [f"{factory}: {param_bytes / MIB:.0f} MiB of parameters, {rounds} rounds"]


def _big(factory: str, param_bytes: int) -> tuple[dict, list[str]]:
    need = 3 * param_bytes + (2 << 30)  # the factory's copy, a rewritten one, headroom
    have = runtime.available_memory_bytes()
    if have < need:
        return {}, [f"{factory} skipped: {runtime.format_bytes(have)} available, "
                    f"{runtime.format_bytes(need)} wanted to try it"]
    r = _cli("optimize", f"{FACTORIES}:{factory}", "--hw", "cpu")
    refused = r["rc"] == 2 and "available on this machine" in r["err"]
    if r["rc"] != 0 and not refused:
        raise RuntimeError(f"optimize {factory} neither ran nor was refused: {r['err'][-500:]}")
    return ({f"{factory}.ran": r["rc"] == 0, f"{factory}.refused_up_front": refused,
             f"{factory}.optimize_rss_over_param_bytes_ratio": r["rss"] / param_bytes,
             f"{factory}.optimize_seconds": r["seconds"]},
            [f"{factory}: " + (r["err"].strip() if refused else "ran")])


def _tables(name: str, target: str, *extra: str) -> dict:
    text = _cli("inspect", target, "--hw", "h100", *extra)
    data = _cli("inspect", target, "--hw", "h100", "--json", *extra)
    if text["rc"] or data["rc"]:
        raise RuntimeError(f"inspect {target} failed: {(text['err'] + data['err'])[-500:]}")
    d = json.loads(data["out"])
    top = [m for m in d["modules"] if m["depth"] == 1]
    pairs = (("flops", "flops"), ("unfused_bytes", "bytes"), ("unfused_us", "time_us"),
             ("fused_us", "fused_time_us"))
    error = max(abs(sum(m[a] for m in top) - d["total"][b]) / d["total"][b] for a, b in pairs)
    return {f"{name}.default_output_lines": text["out"].count("\n"),
            f"{name}.rows_sum_relative_error": error,
            f"{name}.gflop": d["total"]["flops"] / 1e9, f"{name}.params": d["params"],
            f"{name}.inspect_seconds": text["seconds"]}, d


def _real_models() -> tuple[dict, list[str]]:
    sys.path.insert(0, EXAMPLES)
    import flax_gpt2

    figures, _ = _tables("flax_resnet50_224", f"{EXAMPLES}/flax_resnet50.py:inspect")
    more, d = _tables("flax_gpt2_small", f"{EXAMPLES}/flax_gpt2.py:inspect", "--depth", "2")
    figures.update(more)
    c = flax_gpt2.GPT2_SMALL
    names = {"/".join(m["path"][1:]): m for m in d["modules"]}
    figures["flax_gpt2_small.blocks_with_attention_and_mlp_rows"] = sum(
        f"h_{i}/attn" in names and f"h_{i}/mlp" in names for i in range(c.layers))
    figures["flax_gpt2_small.unembedding_gflop"] = names["wte.attend"]["flops"] / 1e9
    figures["flax_gpt2_small.unembedding_over_2_tokens_d_vocab_ratio"] = (
        names["wte.attend"]["flops"] / (2 * c.batch * c.seq * c.d_model * c.vocab))
    return figures, ["real sizes: flax ResNet-50 at 224 px, batch 1 (default depth); GPT-2 small "
                     f"at batch {c.batch} × {c.seq} tokens (--depth 2), both --hw h100"]


def run(quick: bool = False) -> dict:
    mib = 64 if quick else 512
    figures, notes = {}, []
    for model in MODELS:
        print(f"  bench inspect: {model} at {mib} MiB", file=sys.stderr, flush=True)
        more, more_notes = _memory_and_time(f"{model}_{mib}mib", mib * MIB, 1 if quick else 5)
        figures.update({f"{model}_{mib}mib.{k}": v for k, v in more.items()})
        notes += more_notes
    for name in ("optimize_rss_over_param_bytes_ratio", "optimize_rss_over_target_ratio",
                 "optimize_over_inspect_time_ratio"):
        worst = max((figures[f"{m}_{mib}mib.{name}"] for m in MODELS),
                    key=lambda v: v["ratio"] if isinstance(v, dict) else v)
        figures[name] = worst  # the worst of the factories
    if not quick:
        for part, args in ((_big, ("dense_4gib", 4096 * MIB)), (_real_models, ())):
            print(f"  bench inspect: {part.__name__.strip('_')}", file=sys.stderr, flush=True)
            more, more_notes = part(*args)
            figures.update(more)
            notes += more_notes
    notes.append("peak RSS includes the factory's own (its line: the factory run alone) and "
                 "Python + JAX at start; optimize keeps the original graph beside the rewritten "
                 "one, so a folded kernel is one more copy of its parameters; the target "
                 "(optimize_rss_over_target_ratio ≤ 1): the factory alone plus 4× the parameters' "
                 "bytes")
    return {"figures": figures, "notes": notes}
