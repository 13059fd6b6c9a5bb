"""How fast the passes are: against JAX's own dead-code elimination, and inside the fuzzer.

Items 5 and 6 of ``benchmarks/bench_passes.py``. The passes edit equation lists instead of
re-tracing (``ir.edit``) and the verifier checks only what changed, so a structural pass should
cost a small multiple of one walk over the graph.
"""
from __future__ import annotations

import time

from mlsys_jax import timing, passes as P
from mlsys_jax.compat import ClosedJaxpr, jax_dce_jaxpr
from mlsys_jax.passes.registry import pipeline as default_pipeline


def structural_vs_jax_dce(generated_program, quick: bool) -> tuple[dict, list]:
    """The structural passes against JAX's own DCE on one generated program, paired rounds."""
    closed = generated_program(3_000 if quick else 10_000)
    jaxpr = closed.jaxpr

    def fresh():  # JAX caches DCE results by jaxpr identity: give both DCEs a new object
        return ClosedJaxpr(jaxpr.replace(eqns=list(jaxpr.eqns)), closed.consts)

    cse, dce, cse_dce, pipeline = P.cse(), P.dce(), P.chain(P.cse(), P.dce()), default_pipeline()
    fns = {"jax_dce": lambda: jax_dce_jaxpr(fresh().jaxpr, [True] * len(jaxpr.outvars)),
           "dce": lambda: dce(fresh()),
           "cse": lambda: cse(closed),
           "cse_dce": lambda: cse_dce(closed),
           "cse_dce_verified": lambda: P.run(cse_dce, closed, verify=True, cost=False),
           "default_verified": lambda: P.run(pipeline, closed, verify=True, cost=False)}
    t = timing.compare(fns, repeats=3 if quick else 7, warmup=1, number=1)
    r = {k: timing.ratio(t[k], t["jax_dce"]) for k in fns if k != "jax_dce"}
    figures = {"cse_over_jax_dce_ratio": r["cse"].to_dict(),
               "dce_over_jax_dce_ratio": r["dce"].to_dict(),
               "cse_dce_over_jax_dce_ratio": r["cse_dce"].to_dict(),
               "verified_pipeline_over_jax_dce_ratio": r["cse_dce_verified"].to_dict(),
               "verified_default_pipeline_over_jax_dce_ratio": r["default_verified"].to_dict()}
    what = {"dce": "dce", "cse": "cse", "cse_dce": "cse+dce (unverified)",
            "cse_dce_verified": "cse+dce verified after each pass (the 'verified pipeline')",
            "default_verified": "the default pipeline (fold_constants, cse, fold_conv_bn, "
                                "merge_parallel_convs, dce) verified"}
    notes = [f"{len(jaxpr.eqns)} equations: JAX's partial_eval.dce_jaxpr {t['jax_dce'].summary()}"]
    notes += [f"{what[k]}: {t[k].summary()}, ×{r[k].median:.3g} [{r[k].low:.3g}–{r[k].high:.3g}] "
              "of JAX's DCE (paired rounds)" for k in what]
    notes.append("targets: cse+dce ≤ 10× JAX's DCE unverified, the verified pipeline ≤ 25×")
    return figures, notes


def fuzz_rate(quick: bool) -> tuple[dict, list]:
    """The fuzzer's CI tier: programs per second, and the share of its CPU time the passes take."""
    from mlsys_jax.fuzz.program import build
    from mlsys_jax.fuzz.campaign import CampaignOptions, run_campaign
    from mlsys_jax.fuzz.judge import apply_pass
    from mlsys_jax.fuzz.spec import generate_seeded, program_seed
    from mlsys_jax.passes import registry

    programs = 4 if quick else 30
    t0, c0 = time.perf_counter(), time.process_time()  # the CI tier's settings, one process
    s = run_campaign(programs, 0, options=CampaignOptions(gradient_every=2, system_every=100,
                                                          shrink_failures=False))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    passes = registry.instantiate()
    c0 = time.process_time()  # the same programs, passes only, verified as the campaign runs them
    for i in range(programs):
        closed = build(generate_seeded(program_seed(0, i)))
        for p in passes.values():
            apply_pass(p, closed)
    passes_cpu = time.process_time() - c0
    figures = {"fuzz_ci_programs_per_second": programs / wall,
               "fuzz_ci_programs_per_cpu_second": programs / cpu,
               "fuzz_ci_passes_over_campaign_cpu_ratio": passes_cpu / cpu}
    notes = [f"fuzz CI tier (tests/fuzz/test_campaign.py's settings), programs 0–{programs - 1} "
             f"of seed 0 in one process: {programs / wall:.3g} programs/s wall, "
             f"{programs / cpu:.3g} per CPU second ({len(s.failures)} failures). Running every "
             f"pass verified on the same programs again (their kernels compiled) takes "
             f"{100 * passes_cpu / cpu:.3g}% of that CPU time: the rest is evaluating programs op "
             "by op and their derivatives, mostly XLA compiling a kernel for each new convolution or "
             "transcendental (data moves and correctly rounded arithmetic run in NumPy, same bits)"]
    return figures, notes


def validation_cost(generated_program, block, quick: bool) -> tuple[dict, list]:
    """Translation validation's cost: the default pipeline verified, with every rewrite validated
    on its region (as ``passes.run`` runs by default) and without, paired rounds, on the
    generated program against JAX's DCE, and on the §4.2 block, where the rules rewrite."""
    closed = generated_program(3_000 if quick else 10_000)
    jaxpr = closed.jaxpr
    pipeline = default_pipeline()

    def fresh():
        return ClosedJaxpr(jaxpr.replace(eqns=list(jaxpr.eqns)), closed.consts)

    fns = {"jax_dce": lambda: jax_dce_jaxpr(fresh().jaxpr, [True] * len(jaxpr.outvars)),
           "validated": lambda: P.run(pipeline, closed, verify=True, cost=False),
           "unvalidated": lambda: P.run(pipeline, closed, verify=True, cost=False,
                                        validate=False)}
    repeats = 3 if quick else 7
    t = timing.compare(fns, repeats=repeats, warmup=1, number=1)
    small = block(quick)
    on_block = {"validated": lambda: P.run(pipeline, small, verify=True, cost=False),
                "unvalidated": lambda: P.run(pipeline, small, verify=True, cost=False,
                                             validate=False)}
    b = timing.compare(on_block, repeats=repeats, warmup=1, number=1)
    r_val, r_unval = (timing.ratio(t[k], t["jax_dce"]) for k in ("validated", "unvalidated"))
    r_self, r_block = timing.ratio(t["validated"], t["unvalidated"]), \
        timing.ratio(b["validated"], b["unvalidated"])
    figures = {"validated_pipeline_over_jax_dce_ratio": r_val.to_dict(),
               "unvalidated_pipeline_over_jax_dce_ratio": r_unval.to_dict(),
               "validated_over_unvalidated_pipeline_ratio": r_self.to_dict(),
               "resnet_block_validated_over_unvalidated_pipeline_ratio": r_block.to_dict()}
    notes = [f"{len(jaxpr.eqns)} equations, the default pipeline verified: validated "
             f"{t['validated'].summary()} (×{r_val.median:.3g} of JAX's DCE), unvalidated "
             f"{t['unvalidated'].summary()} (×{r_unval.median:.3g}); validated over unvalidated "
             f"×{r_self.median:.3g} [{r_self.low:.3g}–{r_self.high:.3g}] (target ≤ 3×)",
             f"§4.2 block ({len(small.jaxpr.eqns)} equations, the rules rewrite): validated "
             f"{b['validated'].summary()}, unvalidated {b['unvalidated'].summary()}, "
             f"×{r_block.median:.3g} [{r_block.low:.3g}–{r_block.high:.3g}]"]
    return figures, notes


# ---- whole models: the verified pipeline against XLA's compile, validated against unvalidated ---

MODELS = {  # name -> (example file, full tier's factory, quick tier's)
    "resnet50": ("flax_resnet50.py", "inspect", "inspect_tiny"),
    "gpt2_small": ("flax_gpt2.py", "inspect", "inspect_tiny"),
}
QUICK_NAMES = {"resnet50": "resnet50_tiny", "gpt2_small": "gpt2_tiny"}  # the figures' names


def _inference_graph(file: str, factory: str):
    """A factory's ``(apply, (params, x))`` traced with the parameters as constants, as
    ``optimize`` traces it (an inference graph: every fold has constants to fold); the model built
    ``benchmarks.building()``."""
    from functools import partial
    from pathlib import Path

    import jax

    from benchmarks import building
    from benchmarks._cpu_model import _example
    from mlsys_jax import ir

    with jax.enable_x64(False):  # a user's model, under JAX's defaults
        with building():
            apply, (params, *args) = getattr(_example(
                Path(__file__).resolve().parents[1] / "examples" / file), factory)()
        return ir.trace(partial(apply, params), *args)


def model_validation_cost(compile_fn, quick: bool) -> tuple[dict, list]:
    """On ResNet-50 at 224 (quick: the same code, one block per stage, at 32) and GPT-2 small
    (quick: its tiny configuration), parameters folded in as constants: the default pipeline
    verified, with every rewrite validated on its region and without, paired rounds (wall time,
    after one warm-up run each, so the eager kernels are compiled); on ResNet-50 also XLA
    compiling the same graph in the same rounds (a fresh function each time: no cache), and the
    validated pipeline with every region validated compiled and batched
    (``passes/validate_compiled.py``, its pair programs compiled in the warm-up). The first
    validated run of the process (cold: its kernels compiled) is timed once."""
    from mlsys_jax.passes import validate, validate_compiled

    pipeline = default_pipeline()
    repeats = 3 if quick else 5
    figures, notes = {}, []
    for model, (file, full, tiny) in MODELS.items():
        name = QUICK_NAMES[model] if quick else model
        try:
            closed = _inference_graph(file, tiny if quick else full)
        except ImportError as e:  # flax: the 'ecosystem' extra
            notes.append(f"{name}: skipped ({e})")
            continue

        def validated(after, closed=closed):
            with validate.compiled(after):
                return P.run(pipeline, closed, verify=True, cost=False)
        cold = timing.time_once(lambda: validated(0))  # noqa: B023 (called in this iteration)
        fns = {"validated": lambda: validated(0),  # noqa: B023
               "unvalidated": lambda: P.run(pipeline, closed, verify=True, cost=False,  # noqa: B023
                                            validate=False)}
        fns["compiled"] = lambda: validated(1)  # noqa: B023
        if model == "resnet50":
            fns["xla_compile"] = lambda: compile_fn(closed)  # noqa: B023
        before = dict(validate_compiled.STATS)
        t = timing.compare(fns, repeats=repeats, warmup=1, number=1)
        stats = {k: validate_compiled.STATS[k] - before[k] for k in before}
        r = timing.ratio(t["validated"], t["unvalidated"])
        rc = timing.ratio(t["compiled"], t["unvalidated"])
        figures[f"{name}_validated_over_unvalidated_ratio"] = r.to_dict()
        figures[f"{name}_compiled_validation_over_unvalidated_ratio"] = rc.to_dict()
        eqns, rewrites = len(closed.jaxpr.eqns), len(validated(0).rewrites)
        line = (f"{name} ({file}:{tiny if quick else full}, {eqns} equations, {rewrites} "
                f"rewrites): the default pipeline verified, validated {t['validated'].summary()}, "
                f"unvalidated {t['unvalidated'].summary()}: ×{r.median:.3g} [{r.low:.3g}–"
                f"{r.high:.3g}] (paired rounds, target ≤ 1.5×); the first validated run of the "
                f"process {cold * 1e6:.4g} µs; every region validated compiled and batched "
                f"{t['compiled'].summary()}: ×{rc.median:.3g} [{rc.low:.3g}–{rc.high:.3g}] "
                f"({stats['reused']} runs of {stats['compiled']} pair programs)")
        if model == "resnet50":
            c = timing.ratio(t["validated"], t["xla_compile"])
            cc = timing.ratio(t["compiled"], t["xla_compile"])
            figures["verified_pipeline_over_xla_compile_ratio"] = c.to_dict()
            figures["verified_pipeline_compiled_validation_over_xla_compile_ratio"] = cc.to_dict()
            line += (f"; XLA compiling the same graph {t['xla_compile'].summary()}: the validated "
                     f"pipeline ×{c.median:.3g} [{c.low:.3g}–{c.high:.3g}] of it, compiled "
                     f"validation ×{cc.median:.3g} [{cc.low:.3g}–{cc.high:.3g}] (target ≤ 1)")
        notes.append(line)
    return figures, notes
