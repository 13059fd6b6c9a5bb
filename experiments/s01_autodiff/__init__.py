"""Experiment 01 · autodiff and execution models (lecture §3, §8; script 01 demos 1–4; ex. 1, 2, 8).

Demo 1: one set of VJP rules (JAX's), organised two ways — graph mode (the gradient is a jaxpr,
run by our graph executor) and tape mode (eager Tensors recording ``jax.vjp`` closures) — plus
``jax.value_and_grad`` under jit as the reference. Demo 2: what a whole-program view buys (partial
execution, CSE, fusion). Demo 3: what it costs (symbols instead of values, control flow as graph
ops). Demo 4: graph-break capture (PyTorch 2's answer) with ``mlsys_jax.explain``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlsys_jax import models, runtime
from mlsys_jax.cost import estimate, liveness
from mlsys_jax.execute import Graph, explain, grad_graph, make_graph, run as run_graph, tape as T
from mlsys_jax.ir import op_view, primitive_counts, trace
from mlsys_jax.models import mlp_loss
from mlsys_jax.models.mlp import softmax_xent
from mlsys_jax.results import Check, Result, check_settings, resolve_overrides

ID = "01"
TITLE = "Autodiff and execution models: graph vs tape, partial execution, tracers, graph breaks"
DEFAULTS = {"batch": 32, "steps": 30, "lr": 0.5, "fusion_batch": 8192, "seed": 0}
LECTURE = {"fwd_nodes": 12, "grad_nodes": 30, "graph_ops": 20, "tape_ops": 22, "loss": (2.6130, 0.0209),
           "partial": (6, 9), "cse": (9, 8), "kernels": (6, 4), "us": (31.1, 22.0), "where_ops": 5}


_REF_STEP = jax.jit(jax.value_and_grad(mlp_loss))  # the reference: one compiled program per step


def numpy_init(seed: int, batch: int, sizes=(784, 100, 10)):
    """The classifier's parameters and a batch from NumPy's generator, as the lecture's minigraph
    (same scheme as ``models.mlp_init``: normal / sqrt(fan_in), zero biases); float64."""
    rng = np.random.default_rng(seed)
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"W{i}"] = jnp.asarray(rng.standard_normal((n_in, n_out)) / np.sqrt(n_in))
        params[f"b{i}"] = jnp.asarray(np.zeros(n_out))
    x = jnp.asarray(rng.standard_normal((batch, sizes[0])))
    y = jnp.asarray(np.eye(sizes[-1])[rng.integers(0, sizes[-1], batch)])
    return params, x, y


def _feed(g, *args):
    return dict(zip(g.input_names, jax.tree_util.tree_leaves(args)))


def tape_loss(P, x, y):
    """The classifier in tape mode, written with Tensor ops as one would in PyTorch."""
    h = T.relu(x @ P["W1"] + P["b1"])
    return T.apply(softmax_xent, h @ P["W2"] + P["b2"], y, name="softmax_xent")


def _tape_step(params, x, y, count=False):
    P = {k: T.Tensor(v, requires_grad=True) for k, v in params.items()}
    T.COUNTER.reset()
    loss = tape_loss(P, T.Tensor(x), T.Tensor(y))
    loss.backward(count_ops=count)
    return loss.value, {k: P[k].grad for k in params}


def demo1(s):
    """Graph vs tape vs jax.grad: node counts, ops per step, gradient equality, 30 SGD steps."""
    params, x, y = numpy_init(s["seed"], s["batch"])
    fwd, g = make_graph(mlp_loss, params, x, y), grad_graph(mlp_loss, params, x, y)
    n_in = len(fwd.input_names)
    r = run_graph(g, g.output_names, _feed(g, params, x, y))
    tape_loss_v, tape_grads = _tape_step(params, x, y, count=True)
    tape_ops = T.COUNTER.forward + T.COUNTER.backward
    with T.all_input_grads():
        _tape_step(params, x, y, count=True)
    tape_all_ops = T.COUNTER.forward + T.COUNTER.backward
    ref_loss, ref_grads = _REF_STEP(params, x, y)
    diff = lambda a, b: max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in a)  # noqa: E731
    graph_grads = {k: r.by_name[f"grad/{k}"] for k in params}
    counts = [
        {"graph": "forward", "ops": len(op_view(fwd.closed)), "inputs": n_in,
         "nodes": n_in + len(op_view(fwd.closed)), "primitives": sum(primitive_counts(fwd.closed).values()),
         "lecture_nodes": LECTURE["fwd_nodes"]},
        {"graph": "forward+gradient", "ops": len(op_view(g.closed)), "inputs": n_in,
         "nodes": n_in + len(op_view(g.closed)), "primitives": sum(primitive_counts(g.closed).values()),
         "lecture_nodes": LECTURE["grad_nodes"]}]
    per_step = [
        {"mode": "graph (executor, fetch loss+grads)", "ops": r.stats.ops_executed, "lecture": LECTURE["graph_ops"]},
        {"mode": "tape, requires_grad skips x", "ops": tape_ops, "lecture": None},
        {"mode": "tape, every input differentiated", "ops": tape_all_ops, "lecture": LECTURE["tape_ops"]},
        {"mode": "jax.value_and_grad under jit", "ops": 1, "lecture": None}]
    equality = {"graph_vs_tape_bitwise": all(np.array_equal(graph_grads[k], tape_grads[k]) for k in params)
                and np.array_equal(r.by_name["loss"], tape_loss_v),
                "graph_vs_tape_max": diff(graph_grads, tape_grads),
                "graph_vs_jit_max": diff(graph_grads, ref_grads),
                "loss_graph_vs_jit": abs(float(r.by_name["loss"]) - float(ref_loss))}
    return counts, per_step, equality, _train(s, params, x, y, g)


def _train(s, params, x, y, g):
    """30 SGD steps in each mode from the same init; the loss per step."""
    opt = optax.sgd(s["lr"])
    vg = _REF_STEP

    @jax.jit  # one compiled update for every mode (the update is not what is compared)
    def update(p, state, grads):
        updates, state = opt.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    def graph_grads(p):
        r = run_graph(g, g.output_names, _feed(g, p, x, y))
        return r.by_name["loss"], {k: r.by_name[f"grad/{k}"] for k in p}

    modes = {"graph": graph_grads, "tape": lambda p: _tape_step(p, x, y), "jit": lambda p: vg(p, x, y)}
    losses = {}
    for name, step in modes.items():
        p, state, out = params, opt.init(params), []
        for _ in range(s["steps"]):
            loss, grads = step(p)
            p, state = update(p, state, grads)
            out.append(float(loss))
        losses[name] = out
    return losses


def with_aux(params, x, y):
    """The loss plus a monitoring output: the largest |pre-activation| (re-computes x @ W1)."""
    h = jax.nn.relu(x @ params["W1"] + params["b1"])
    loss = softmax_xent(h @ params["W2"] + params["b2"], y)
    return {"loss": loss, "aux": jnp.abs(x @ params["W1"]).max()}


def demo2(s):
    """Partial execution, CSE of the duplicated x @ W1, fusion at batch 8192 on the H100 model."""
    from mlsys_jax.passes import cse, prune_outputs, run as run_passes

    params, x, y = numpy_init(s["seed"], s["batch"])
    g = make_graph(with_aux, params, x, y)
    feed = _feed(g, params, x, y)
    only = run_graph(g, ["loss"], feed)
    both = run_graph(g, ["loss", "aux"], feed)
    deduped = run_passes(cse(), g.closed).jaxpr
    after = run_graph(Graph(deduped, g.input_names, g.output_names), ["loss", "aux"], feed)
    i_loss = g.output_names.index("loss")
    # the executor's peak vs the liveness analysis of the same (pruned) graph
    live = [liveness(prune_outputs(g.closed, [i_loss])).peak_bytes, liveness(g.closed).peak_bytes,
            liveness(deduped).peak_bytes]
    partial = [{"fetch": "loss", "ops": only.stats.ops_executed, "lecture": LECTURE["partial"][0],
                "peak_bytes": only.stats.peak_bytes, "liveness_peak_bytes": live[0]},
               {"fetch": "loss + aux", "ops": both.stats.ops_executed, "lecture": LECTURE["partial"][1],
                "peak_bytes": both.stats.peak_bytes, "liveness_peak_bytes": live[1]},
               {"fetch": "loss + aux after CSE", "ops": after.stats.ops_executed,
                "lecture": LECTURE["cse"][1], "peak_bytes": after.stats.peak_bytes,
                "liveness_peak_bytes": live[2]}]
    same = all(np.array_equal(a, b) for a, b in zip(after.values, both.values))
    spec = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731  (shapes only)
    big = trace(mlp_loss, {k: spec(*v.shape) for k, v in params.items()},
                spec(s["fusion_batch"], 784), spec(s["fusion_batch"], 10))
    fusion = []
    for fused, lk, lus in ((False, *[LECTURE["kernels"][0], LECTURE["us"][0]]),
                           (True, LECTURE["kernels"][1], LECTURE["us"][1])):
        rep = estimate(big, hw="h100", dtype="bf16", fused=fused)
        fusion.append({"fused": fused, "kernels": len(rep.kernels), "lecture_kernels": lk,
                       "time_us": rep.time_us, "lecture_us": lus,
                       "names": " ".join(k.name for k in rep.kernels)})
    removed = [o.name for o in op_view(g.closed)]
    for o in op_view(deduped):
        removed.remove(o.name)
    return partial, fusion, {"cse_removed": removed, "cse_same_values": same}


def _branches(hits):
    def double(h):
        jax.debug.callback(lambda: hits.append("double"))
        return h * 2

    def expo(h):
        jax.debug.callback(lambda: hits.append("exp"))
        return jnp.exp(h)
    return double, expo


def demo3(s):
    """Symbols, not values: print a traced value; a Python if on it; where vs cond."""
    seen = []

    def show(x):
        h = jax.nn.relu(x)
        seen.append(str(h))  # inside tracing h is a symbol with a shape, no numbers
        return h

    x = jnp.asarray(np.linspace(-1, 1, 12).reshape(4, 3), jnp.float32)
    jax.make_jaxpr(show)(x)
    try:
        jax.jit(lambda h: h * 2 if h.sum() > 0 else jnp.exp(h))(x)
        if_error = "(no error)"
    except jax.errors.TracerBoolConversionError as e:
        if_error = str(e).splitlines()[0]
    rows = []
    for name in ("where", "cond"):
        hits: list = []
        double, expo = _branches(hits)
        if name == "where":
            fn = lambda h: jnp.where(h.sum() > 0, double(h), expo(h))  # noqa: E731, B023 (called in this iteration)
        else:
            fn = lambda h: jax.lax.cond(h.sum() > 0, double, expo, h)  # noqa: E731, B023 (called in this iteration)
        r = run_graph(make_graph(fn, x), ["out"], {"h": x})
        jax.effects_barrier()
        names = [n for n in r.stats.op_names if n != "debug_callback"]  # the counters themselves
        rows.append({"control flow": name, "ops": len(names),
                     "op_names": " ".join(names), "branches_run": len(hits),
                     "lecture_ops": LECTURE["where_ops"] if name == "where" else None,
                     "equal_eager": bool(np.array_equal(r.values[0], fn(x)))})
    return {"printed": seen[0], "if_error": if_error}, rows


def demo4(s):
    """explain(): one graph for straight-line code, a break at a data-dependent if (ex. 8)."""
    rng = np.random.default_rng(s["seed"])
    x, w1, w2 = (jnp.asarray(rng.standard_normal(shape), jnp.float32)
                 for shape in ((s["batch"], 64), (64, 64), (64, 10)))
    cases = [("relu(x @ w1) @ w2", models.mlp2, (x, w1, w2)),
             ("branchy, h.sum() > 0", models.branchy, (x, w1)),
             ("branchy, h.sum() == 0", models.branchy, (jnp.abs(x), -jnp.abs(w1))),
             ("jnp.where (ex. 8)", models.branchy_where, (x, w1)),
             ("lax.cond (ex. 8)", models.branchy_cond, (x, w1))]
    rows = []
    for name, fn, args in cases:
        e = explain(fn, *args)
        rows.append({"function": name, "graphs": e.graph_count, "breaks": e.graph_break_count,
                     "ops_per_graph": " | ".join(" ".join(ops) for ops in e.ops_per_graph),
                     "break_reason": e.break_reasons[0].reason if e.break_reasons else "",
                     "equal_eager": bool(np.array_equal(e.out, fn(*args)))})
    return rows


def exercises(s):
    """Ex. 1: sigmoid's VJP keeps only its output. Ex. 2: a broadcast bias's gradient sums the batch."""
    x = jnp.asarray(np.random.default_rng(s["seed"]).standard_normal((5, 3)))
    y, vjp = jax.vjp(jax.nn.sigmoid, x)
    saved = jax.tree_util.tree_leaves(vjp)
    yn, ctn = np.asarray(y), np.cos(np.asarray(x))  # NumPy for the checks' own arithmetic
    ct = jnp.asarray(ctn)
    # JAX's logistic JVP saves y·(1−y), computed in the forward from y alone
    ex1 = {"saves_y": any(np.array_equal(r, yn) or np.array_equal(r, yn * (1 - yn)) for r in saved),
           "saves_x": any(np.array_equal(r, x) for r in saved), "n_saved": len(saved),
           "vjp_err": float(np.max(np.abs(np.asarray(vjp(ct)[0]) - ctn * yn * (1 - yn))))}
    b = T.Tensor(jnp.zeros(3, jnp.float64), requires_grad=True)
    out = T.Tensor(x) + b
    out.backward(grad=ct)
    jaxpr = jax.make_jaxpr(jax.vjp(lambda bb: x + bb, b.value)[1])(ct)
    sums = [e.params["axes"] for e in jaxpr.jaxpr.eqns if e.primitive.name == "reduce_sum"]
    ex2 = {"b_grad_is_batch_sum": bool(np.array_equal(b.grad, jnp.sum(ct, axis=0))),
           "reduce_axes": [list(a) for a in sums]}
    return ex1, ex2


def run(**overrides) -> Result:
    s = resolve_overrides(ID, DEFAULTS, overrides)
    check_settings(ID, s, DEFAULTS, minimum={"batch": 1, "steps": 1, "fusion_batch": 1, "seed": 0},
                   maximum={"seed": (2**32 - 1, "a 32-bit seed")})
    # a (batch, 784) float64 batch through the classifier: its activations, gradients and tape
    # (≈ 8 copies); fusion_batch is only costed, never allocated
    runtime.check_memory(8 * 8 * s["batch"] * (784 + 100 + 10), f"experiment 01 with batch="
                         f"{s['batch']}", "lower --set batch")
    runtime.enable_x64()
    counts, per_step, equality, losses = demo1(s)
    partial, fusion, cse_info = demo2(s)
    shown, control = demo3(s)
    breaks = demo4(s)
    ex1, ex2 = exercises(s)
    steps = [{"mode": m, "first_loss": v[0], "last_loss": v[-1], "steps": len(v),
              "lecture_first": LECTURE["loss"][0], "lecture_last": LECTURE["loss"][1]} for m, v in losses.items()]
    notes = [
        f"graph vs tape gradients bitwise equal: {equality['graph_vs_tape_bitwise']} (max |diff| "
        f"{equality['graph_vs_tape_max']:.3g}): both run the same JAX VJP primitives one at a time; "
        f"jax.value_and_grad under jit differs by {equality['graph_vs_jit_max']:.3g} (XLA compiles "
        "and fuses the whole step, e.g. contracting mul+add into FMAs, so it rounds differently)",
        "ops per step: graph mode counts relu's mask (gt) as its own forward op; tape mode computes "
        "it inside relu's VJP forward. Differentiating x too costs one more matmul here, not the "
        "lecture's two: JAX's dot_general transpose rule contracts against W directly, no transpose",
        f"node counts are inputs + op-view ops; the gradient graph's ops are JAX's VJP rules "
        f"(lecture's minigraph 30 nodes, ours {counts[1]['nodes']})",
        f"printed inside tracing: {shown['printed']}",
        f"Python if on a traced value: {shown['if_error']} — jit traces with abstract values "
        "(shape and dtype only), so Python cannot choose a branch; use lax.cond or jnp.where",
        f"CSE removed {cse_info['cse_removed']} (the aux branch's x @ W1); values unchanged: "
        f"{cse_info['cse_same_values']}",
        f"exercise 1: sigmoid's VJP saves {ex1['n_saved']} array, y·(1−y) (a function of the "
        f"output only): {ex1['saves_y']}, saves x: {ex1['saves_x']}, "
        f"x̄ = ȳ·y·(1−y) to {ex1['vjp_err']:.1e}; exercise 2: b̄ = Σ_batch ȳ bitwise: "
        f"{ex2['b_grad_is_batch_sum']} (JAX's unbroadcast: reduce_sum over axes "
        f"{ex2['reduce_axes']} of the (B, d) adjoint, the second over the kept size-1 axis)"]
    return Result(ID, TITLE, tables={"demo1_nodes": counts, "demo1_ops_per_step": per_step,
                                     "demo1_sgd": steps, "demo2_partial_cse": partial,
                                     "demo2_fusion_h100": fusion, "demo3_control_flow": control,
                                     "demo4_explain": breaks},
                  notes=notes, data={"equality": equality, "losses": losses, "cse": cse_info,
                                     "ex1": ex1, "ex2": ex2, "shown": shown, "settings": s})


def check(result: Result) -> list[Check]:
    t, d = result.tables, result.data
    eq, losses = d["equality"], d["losses"]
    ops = dict(zip(("graph", "tape", "tape all", "jit"), (r["ops"] for r in t["demo1_ops_per_step"])))
    partial, fusion = t["demo2_partial_cse"], t["demo2_fusion_h100"]
    ctrl = {r["control flow"]: r for r in t["demo3_control_flow"]}
    ex = {r["function"]: r for r in t["demo4_explain"]}
    jit_gap = max(abs(a - b) for a, b in zip(losses["graph"], losses["jit"]))
    return [
        Check("graph vs tape gradients bitwise equal (float64)", eq["graph_vs_tape_bitwise"] or
              eq["graph_vs_tape_max"] <= 1e-15, eq["graph_vs_tape_max"], 0.0),
        Check("30-step losses: graph == tape bitwise, jit within 1e-12",
              losses["graph"] == losses["tape"] and jit_gap <= 1e-12, jit_gap),
        Check("training converges (last loss < first / 10)",
              losses["graph"][-1] < losses["graph"][0] / 10,
              (round(losses["graph"][0], 4), round(losses["graph"][-1], 4)), LECTURE["loss"],
              note="the lecture's run starts from NumPy's random initialisation, ours from "
                   "NumPy's generator with our seed: other weights, the same convergence"),
        Check("requires_grad skips work: tape ops < tape ops with every input differentiated",
              ops["tape"] < ops["tape all"], (ops["tape"], ops["tape all"]), (20, 22),
              note="JAX's matmul VJP contracts with the transposed operand directly, so the unneeded "
                   "input gradient costs one op here, not the lecture's transpose + matmul"),
        Check("partial execution: loss-only runs fewer ops than loss + aux",
              partial[0]["ops"] < partial[1]["ops"], (partial[0]["ops"], partial[1]["ops"]), LECTURE["partial"]),
        Check("executor peak bytes = liveness analysis of the same graph",
              all(r["peak_bytes"] == r["liveness_peak_bytes"] for r in partial),
              [r["peak_bytes"] for r in partial]),
        Check("CSE removes exactly the duplicated x @ W1", d["cse"]["cse_removed"] == ["matmul"]
              and partial[2]["ops"] == partial[1]["ops"] - 1 and d["cse"]["cse_same_values"],
              (partial[1]["ops"], partial[2]["ops"]), LECTURE["cse"]),
        Check("fusion at batch 8192 on the H100 model: 6 → 4 kernels",
              (fusion[0]["kernels"], fusion[1]["kernels"]) == (6, 4),
              (fusion[0]["kernels"], fusion[1]["kernels"]), LECTURE["kernels"]),
        Check("fusion µs on the H100 model (31.1 → 22.0)",
              (round(fusion[0]["time_us"], 1), round(fusion[1]["time_us"], 1)) == LECTURE["us"],
              (round(fusion[0]["time_us"], 1), round(fusion[1]["time_us"], 1)), LECTURE["us"]),
        Check("jnp.where runs both branches, lax.cond one",
              ctrl["where"]["branches_run"] == 2 and ctrl["cond"]["branches_run"] == 1,
              {"branches run": (ctrl["where"]["branches_run"], ctrl["cond"]["branches_run"]),
               "ops": (ctrl["where"]["ops"], ctrl["cond"]["ops"])}, {"branches run": (2, 1), "ops": (5, None)},
              note="the lecture counts only minigraph's where (5 ops); lax.cond's count is ours"),
        Check("explain: relu(x@w1)@w2 is 1 graph [matmul relu matmul]",
              (ex["relu(x @ w1) @ w2"]["graphs"], ex["relu(x @ w1) @ w2"]["ops_per_graph"])
              == (1, "matmul relu matmul"), ex["relu(x @ w1) @ w2"]["ops_per_graph"]),
        Check("explain: branchy is 2 graphs, 1 break, [matmul relu sum gt] | [mul] or [exp]",
              all((ex[k]["graphs"], ex[k]["breaks"], ex[k]["ops_per_graph"]) == (2, 1, f"matmul relu sum gt | {op}")
                  for k, op in (("branchy, h.sum() > 0", "mul"), ("branchy, h.sum() == 0", "exp"))),
              ex["branchy, h.sum() > 0"]["ops_per_graph"]),
        Check("exercise 8: where and cond are 1 graph, 0 breaks",
              all((ex[k]["graphs"], ex[k]["breaks"]) == (1, 0) for k in ("jnp.where (ex. 8)", "lax.cond (ex. 8)")),
              (ex["jnp.where (ex. 8)"]["ops_per_graph"], ex["lax.cond (ex. 8)"]["ops_per_graph"])),
        Check("captured results equal eager bitwise", all(r["equal_eager"] for r in t["demo4_explain"]),
              len(t["demo4_explain"])),
        Check("exercise 1: sigmoid VJP saves only a function of y, not x", d["ex1"]["saves_y"] and not d["ex1"]["saves_x"],
              (d["ex1"]["saves_y"], d["ex1"]["saves_x"]), (True, False)),
        Check("exercise 2: bias gradient = sum over the batch axis", d["ex2"]["b_grad_is_batch_sum"]
              and d["ex2"]["reduce_axes"][0] == [0], d["ex2"]["reduce_axes"]),
    ]


def plots(result: Result, directory: str) -> list[str]:
    """No picture for this section: its figures are the tables (and the report shows them)."""
    return []
