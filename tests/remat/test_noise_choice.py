"""Plans whose measured step times overlap within their paired rounds are indistinguishable: the
one with the fewest compiled FLOPs is taken, and the choice says so with the intervals."""
from dataclasses import replace

from mlsys_jax.remat.milp import Plan, plan_key
from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.timing import Ratio

BASE = Plan(peak_budget_bytes=0, segments=(0,), saved=(), recomputed=("a",),
            predicted_peak_bytes=1, recompute_flops=0, min_peak_budget_bytes=None,
            store_all_bytes=1, n_values=1, solve_seconds=0.0, compiled_temp_bytes=10)


def _frontier(ratios: dict) -> tuple[Frontier, list]:
    fr = Frontier.__new__(Frontier)
    plans = [replace(BASE, recomputed=(name,), compiled_flops=flops) for name, (flops, _) in
             ratios.items()]
    fr.timings = {plan_key(p): r for p, (_, r) in zip(plans, ratios.values())}
    fr.labels = {plan_key(p): p.recomputed[0] for p in plans}
    fr.choice = ""
    return fr, plans


def test_overlapping_intervals_take_the_fewest_flops():
    fr, plans = _frontier({"fast": (300.0, Ratio(0.84, 0.63, 1.33)),
                           "lean": (200.0, Ratio(0.90, 0.80, 1.10))})
    got = fr._within_noise(plans[0], plans)
    assert got.recomputed == ("lean",)
    assert "indistinguishable" in fr.choice and "0.63–1.33" in fr.choice


def test_a_plan_faster_in_every_round_is_taken():
    fr, plans = _frontier({"fast": (300.0, Ratio(0.7, 0.65, 0.75)),
                           "lean": (200.0, Ratio(0.9, 0.85, 0.95))})
    assert fr._within_noise(plans[0], plans).recomputed == ("fast",)
    assert fr.choice.startswith("the fastest that fits")
