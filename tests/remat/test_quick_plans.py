"""Where one plan is timed (long steps), plans are compiled for XLA's figures only and the timed
one in full: the figures are a full compile's, and the timed program runs fully optimized."""
import jax
import jax.numpy as jnp

from mlsys_jax.remat.planner import frontier as frontier_mod
from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.remat.planner.measure import compile_grad
from mlsys_jax.remat.planner.apply import flat_applied


def loss(w, x):
    for _ in range(6):
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def test_plans_compiled_quick_when_one_is_timed_report_full_figures(monkeypatch):
    monkeypatch.setattr(frontier_mod, "LONG_STEP_S", 0.0)       # every step counts as long
    with jax.enable_x64(False):
        fr = Frontier(loss, jnp.eye(32) / 2, jnp.ones((64, 32)))
        least = fr.plan("min")
        plans = [p for p in fr.measured if p.recomputed]
        assert plans and all(fr.program(p).compile_s > 0 for p in plans)
        assert any(fr.program(p).quick for p in plans)        # the untimed ones stayed quick
        assert not fr.program(least).quick                   # the answer was timed: in full
        for p in plans:
            _, temp, flops = compile_grad(flat_applied(fr.graph, p), fr.flat)
            assert (p.compiled_temp_bytes, p.compiled_flops) == (temp, flops)


def test_a_probe_likely_timed_is_compiled_in_full_at_once(monkeypatch):
    """A bracketing probe between two plans usually is the plan timed: one full compile, not a
    quick one and then a full one (``Frontier._bracket``)."""
    monkeypatch.setattr(frontier_mod, "LONG_STEP_S", 0.0)
    with jax.enable_x64(False):
        fr = Frontier(loss, jnp.eye(32) / 2, jnp.ones((64, 32)))
        lo, hi = fr.problem.min_peak_budget_bytes, fr.problem.store_all_bytes
        plans = [fr.problem.solve(int(lo + f * (hi - lo))) for f in (0.0, 0.3)]
        quick, full = fr.compile(plans[0]), fr.compile(plans[1], likely_timed=True)
        assert fr.program(quick).quick and not fr.program(full).quick
        assert fr.program(full).compile_s > 0 and fr.programs.full(fr.program(full)) is \
            fr.program(full)
