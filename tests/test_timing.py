"""mlsys_jax.timing: shapes of the results and the ratio arithmetic (no assertion on a time)."""
import statistics
from unittest import mock

import pytest

from mlsys_jax import timing
from mlsys_jax.errors import MlsysError


def test_compare_returns_per_round_samples_for_each_callable():
    calls = {"a": 0, "b": 0}

    def make(name):
        def fn():
            calls[name] += 1
            return name
        return fn

    t = timing.compare({"a": make("a"), "b": make("b")}, repeats=3, warmup=1, number=2)
    assert set(t) == {"a", "b"}
    assert all(len(x.samples) == 3 and x.number == 2 and x.repeats == 3 for x in t.values())
    for x in t.values():  # the summary is the samples' own statistics
        assert (x.median_s, x.min_s, x.max_s) == (statistics.median(x.samples), min(x.samples),
                                                  max(x.samples))
    assert calls == {"a": 1 + 3 * 2, "b": 1 + 3 * 2}  # warm-up, then rounds × number


def test_ratio_is_paired_when_samples_line_up():
    a = timing.Timing(4.0, 2.0, 9.0, 3, 1, (2.0, 4.0, 9.0))
    b = timing.Timing(2.0, 1.0, 3.0, 3, 1, (1.0, 2.0, 3.0))
    r = timing.ratio(a, b)
    assert (r.median, r.low, r.high) == (2.0, 2.0, 3.0)
    unpaired = timing.ratio(timing.Timing(4.0, 2.0, 9.0, 3, 1), b)
    assert (unpaired.median, unpaired.low, unpaired.high) == (2.0, 2.0 / 3.0, 9.0)


def test_best_of_keeps_each_callables_fastest_batch_per_round():
    seen = []
    fns = {name: (lambda name=name: seen.append(name)) for name in "ab"}
    t = timing.compare(fns, repeats=2, warmup=0, number=1, best_of=3)
    assert seen == ["a", "b"] * 6                  # batches interleaved, 3 per round
    assert all(len(x.samples) == 2 for x in t.values())
    # a clock that reads 0 before and d after each batch: batches of a take 5, 1, 3; of b 2, 2, 2
    ticks = iter([0.0, 5.0, 0.0, 2.0, 0.0, 1.0, 0.0, 2.0, 0.0, 3.0, 0.0, 2.0])
    t = timing.compare(fns, repeats=1, warmup=0, number=1, best_of=3, clock=lambda: next(ticks))
    assert t["a"].samples == (1.0,) and t["b"].samples == (2.0,)


@pytest.mark.parametrize("kwargs", [dict(repeats=0), dict(warmup=-1), dict(best_of=0)])
def test_bad_arguments_are_clear_errors(kwargs):
    with pytest.raises(MlsysError, match="timing.compare"):
        timing.compare({"f": lambda: 0}, **kwargs)
    with pytest.raises(MlsysError, match="no callables"):
        timing.compare({})


def test_paired_ratio_spread_is_percentiles_of_the_rounds():
    b = timing.Timing(1.0, 1.0, 1.0, 11, 1, (1.0,) * 11)
    a = timing.Timing(6.0, 1.0, 11.0, 11, 1, tuple(float(i) for i in range(11, 0, -1)))
    r = timing.ratio(a, b, spread=(10, 90))
    assert (r.median, r.low, r.high) == (6.0, 2.0, 10.0)
    assert r.to_dict() == {"ratio": 6.0, "p10": 2.0, "p90": 10.0}
    assert timing.ratio(a, b).to_dict() == {"ratio": 6.0, "min": 1.0, "max": 11.0}
    with pytest.raises(MlsysError, match="timing.ratio: spread"):
        timing.ratio(a, b, spread=(60, 90))


def test_shuffled_rounds_run_every_callable_once_per_round_in_changing_orders():
    seen = []
    fns = {name: (lambda name=name: seen.append(name)) for name in "abc"}
    t = timing.compare(fns, repeats=30, warmup=0, number=1, shuffle=True)
    rounds = [tuple(seen[i:i + 3]) for i in range(0, 90, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds) and len(set(rounds)) > 1
    assert all(len(x.samples) == 30 for x in t.values())


def test_first_results_are_handed_over_once_each_outside_the_timing():
    calls, handed = {"a": 0, "b": 0}, []

    def make(name):
        def fn():
            calls[name] += 1
            return (name, calls[name])
        return fn
    timing.compare({n: make(n) for n in "ab"}, repeats=3, warmup=0, number=2,
                   first_result=lambda name, out: handed.append((name, out)))
    assert sorted(handed) == [("a", ("a", 2)), ("b", ("b", 2))]     # the first batch's last call
    assert calls == {"a": 6, "b": 6}                                 # no extra call for it


class _FakeClock:
    """A clock that only the timed function moves: ``per_call_s`` a call, plus ``stalls`` (seconds
    added to the first trials, one each: another process taking the core)."""

    def __init__(self, per_call_s: float, stalls: list | None = None):
        self.now, self.per_call_s, self.stalls, self.trials = 0.0, per_call_s, list(stalls or []), 0
        self.pending = 0.0

    def __call__(self) -> float:
        return self.now

    def fn(self):
        self.now += self.per_call_s + self.pending
        self.pending = 0.0
        return 0

    def started(self):  # a trial begins: a stall lands on its first call, if one is left
        self.trials += 1
        self.pending = self.stalls.pop(0) if self.stalls else 0.0


def _calibrated(clock: _FakeClock, per_call_guess_s: float, target_s: float = 3e-3) -> int:
    orig = timing._run

    def run(fn, number, c=clock, keep=None):
        clock.started()
        return orig(fn, number, c, keep)
    with mock.patch.object(timing, "_run", run):
        return timing._calibrate(clock.fn, target_s, 10_000, per_call_guess_s, clock)


def test_calibrated_rounds_land_just_over_the_target_not_twice_it():
    # a warm call that overstates the per-call time (its wait for the result) as warm-ups do
    for per_call in (7e-6, 40e-6, 250e-6):
        clock = _FakeClock(per_call)
        n = _calibrated(clock, per_call_guess_s=3 * per_call)
        assert 3e-3 <= n * per_call <= timing.AIM * 3e-3 + per_call, (per_call, n)
        assert clock.trials == 2  # the first guess, one step: as fast a call, no confirmations


def test_a_stalled_trial_does_not_leave_the_rounds_short():
    # the first trial stalls past the target: the confirmations show it, and the count grows
    clock = _FakeClock(7e-6, stalls=[5e-3])
    n = _calibrated(clock, per_call_guess_s=20e-6)
    assert n * 7e-6 >= 3e-3


def test_a_stall_on_the_trial_that_reaches_the_target_is_confirmed_away():
    # the step's trial stalls: slower a call than the trial before, so the best of three decides
    clock = _FakeClock(7e-6, stalls=[0.0, 5e-3])
    n = _calibrated(clock, per_call_guess_s=20e-6)
    assert n * 7e-6 >= 3e-3 and clock.trials > 2
