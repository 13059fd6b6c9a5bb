"""Timing rounds stop once the outcome is settled; policies that save nothing are not timed; a
compile for figures only reports the figures of a full compile."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from mlsys_jax.remat.planner import rounds
from mlsys_jax.remat.planner.policies import distinct
from mlsys_jax.remat.planner.programs import Programs
from mlsys_jax.timing import Timing


def _timing(*samples) -> Timing:
    return Timing(sorted(samples)[len(samples) // 2], min(samples), max(samples), len(samples), 1,
                  tuple(samples))


REF = _timing(1.0, 1.0, 1.0)


def test_a_plan_faster_in_every_round_by_a_clear_margin_settles_the_pick():
    times = {"ref": REF, "a": _timing(0.80, 0.81, 0.79), "b": _timing(1.20, 1.22, 1.19)}
    why = rounds.decide(times, "ref", {"a": 1, "b": 1}, {})
    assert why.startswith("settled") and "a faster than b" in why


def test_overlapping_plans_are_settled_as_indistinguishable():
    times = {"ref": REF, "a": _timing(0.9, 1.1, 1.0), "b": _timing(1.05, 0.95, 1.2)}
    assert "indistinguishable" in rounds.decide(times, "ref", {"a": 1, "b": 1}, {})


def test_apart_in_every_round_but_not_beyond_chance_runs_another_round():
    # b is slower in each round, but the log ratios scatter widely: the t-interval spans 1
    times = {"ref": REF, "a": _timing(0.50, 0.95, 0.70), "b": _timing(1.00, 0.96, 1.40)}
    assert rounds.decide(times, "ref", {"a": 1, "b": 1}, {}) is None


def test_a_policy_within_noise_of_its_plan_is_settled_and_a_lone_plan_has_no_contest():
    times = {"ref": REF, "a": _timing(1.0, 1.1, 0.9), "pol": _timing(1.05, 1.0, 1.0)}
    assert "within the noise" in rounds.decide(times, "ref", {"a": 10}, {"pol": 10})
    assert rounds.decide(times, "ref", {"a": 10}, {"pol": 5}).startswith("nothing to choose")
    assert not rounds.contested({"a": 10}, {"pol": 5}) and rounds.contested({"a": 10}, {"p": 10})
    lo, hi = rounds.interval([0.9, 0.9, 0.9])
    assert lo == pytest.approx(0.9) and hi == pytest.approx(0.9)


def test_policies_at_no_remats_bytes_or_twins_are_not_timed():
    prog = lambda b, f: SimpleNamespace(temp_bytes=b, flops=f)  # noqa: E731
    fr = SimpleNamespace(no_remat=SimpleNamespace(compiled_temp_bytes=100))
    built = {"everything_saveable": prog(80, 5.0), "nothing_saveable": prog(100, 1.0),
             "dots_saveable": prog(60, 9.0), "dots_with_no_batch_dims_saveable": prog(60, 8.0),
             "checkpoint_dots": prog(120, 1.0)}
    timed, skipped = distinct(fr, built)
    assert list(timed) == ["everything_saveable", "dots_with_no_batch_dims_saveable"]
    assert skipped["nothing_saveable"] == "compiles to the same temp bytes as no remat: not timed"
    assert "more temp bytes than no remat" in skipped["checkpoint_dots"]
    assert "same temp bytes as dots_with_no_batch_dims_saveable" in skipped["dots_saveable"]
    # over the report's budget a policy is no answer to it: listed with its share, not timed
    timed, skipped = distinct(fr, built, budget_bytes=70)
    assert list(timed) == ["dots_with_no_batch_dims_saveable"]
    assert skipped["everything_saveable"] == ("compiles to 80% of no remat's temp bytes, over the "
                                              "budget (70%): not timed")
    assert "same temp bytes as dots_with_no_batch_dims_saveable" in skipped["dots_saveable"]
    assert list(distinct(fr, built, budget_bytes=80)[0]) == list(distinct(fr, built)[0])


def _chain(w, x):
    for _ in range(4):
        x = jnp.tanh(x @ w)
    return jnp.sum(x ** 2)


def test_a_quick_compile_has_a_full_compiles_figures_and_is_compiled_in_full_to_be_timed():
    fn = lambda d, b: _chain(d[0], b[0])  # noqa: E731
    policy = jax.checkpoint_policies.everything_saveable
    with jax.enable_x64(False):
        flat = SimpleNamespace(diff=[jnp.eye(16) / 2], batch=[jnp.ones((8, 16))])
        progs = Programs(flat)
        progs.compile("no remat", fn)
        quick = progs.compile("quick", jax.checkpoint(fn, policy=policy), quick=True)
        full = Programs(flat).compile("full", jax.checkpoint(fn, policy=policy))
        assert quick.quick and (quick.temp_bytes, quick.flops) == (full.temp_bytes, full.flops)
        progs.time([quick], repeats=3, budget_s=0.5, decide=lambda t: "enough", least=2)
    assert not quick.quick and quick.grads_max_rel_diff < 1e-6
    assert progs.rounds == 2 and progs.stopped == "enough"
