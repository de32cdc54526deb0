"""Paired ratios, their confidence intervals and the decisions drawn from them, against values
computed by hand (t quantiles from tables)."""

import math

import pytest

from workbench.stats import (
    RatioCI,
    after_warmup,
    decide,
    geometric_mean,
    paired_ratios,
    paired_summary,
    per_step_key,
    per_step_ratios,
    ratio_ci,
    ratio_source,
    running_speedups,
    step_ratios,
    two_sample,
)


def test_paired_ratios_and_their_errors():
    assert paired_ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]
    with pytest.raises(ValueError, match="equal lengths"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="> 0"):
        paired_ratios([1.0], [0.0])


def test_ratio_ci_by_hand():
    # logs of (e^0.1, e^0.2, e^0.3): mean 0.2, sd 0.1, n 3, t_{0.975, 2} = 4.302653
    r = ratio_ci([math.exp(0.1), math.exp(0.2), math.exp(0.3)])
    h = 4.302653 * 0.1 / math.sqrt(3)
    assert r.mean == pytest.approx(math.exp(0.2))
    assert r.low == pytest.approx(math.exp(0.2 - h), rel=1e-6)
    assert r.high == pytest.approx(math.exp(0.2 + h), rel=1e-6)
    assert r.half_width == pytest.approx(math.exp(h) - 1, rel=1e-6)
    assert r.n == 3


def test_ratio_ci_is_a_geometric_mean_not_an_arithmetic_one():
    r = ratio_ci([0.5, 2.0])  # a halving and a doubling cancel out
    assert r.mean == pytest.approx(1.0)
    assert r.low < 1.0 < r.high


def test_ratio_ci_of_one_value_has_no_interval_and_bad_input_raises():
    assert ratio_ci([1.3]) == RatioCI(pytest.approx(1.3), None, None, 1, None)
    with pytest.raises(ValueError):
        ratio_ci([])
    with pytest.raises(ValueError):
        ratio_ci([1.0, -1.0])


def test_identical_ratios_give_a_zero_width_interval():
    r = ratio_ci([1.25] * 5)
    assert r.low == pytest.approx(1.25) and r.high == pytest.approx(1.25) and r.half_width == pytest.approx(0.0)


def test_step_ratios_swap_the_gen_stage():
    # step 10 s of which gen 6 s; the paired autoregressive gen took 9 s -> (10 - 6 + 9) / 10
    assert step_ratios([10.0], [6.0], [9.0]) == [pytest.approx(1.3)]
    with pytest.raises(ValueError):
        step_ratios([1.0], [1.0, 2.0], [1.0])


def test_after_warmup():
    assert after_warmup([1, 2, 3], 1) == [2, 3]
    assert after_warmup([1, 2, 3], 0) == [1, 2, 3]
    assert after_warmup([1], 1) == [1]  # a run shorter than its warm-up keeps its values


def test_decide_best_only_when_intervals_separate():
    a = RatioCI(1.5, 1.4, 1.6, 10, 0.07)
    b = RatioCI(1.2, 1.1, 1.3, 10, 0.08)
    c = RatioCI(1.35, 1.25, 1.45, 10, 0.08)
    assert decide({"a": a, "b": b}).best == "a"
    d = decide({"a": a, "b": b, "c": c})  # c's upper end 1.45 reaches a's lower end 1.4
    assert d.best is None and d.tied == ("a", "c") and d.top == "a"
    assert decide({}).best is None


def test_decide_treats_unknown_intervals_as_overlapping():
    d = decide({"a": RatioCI(2.0, None, None, 1, None), "b": RatioCI(1.0, 0.9, 1.1, 5, 0.1)})
    assert d.best is None and d.tied == ("a", "b")


def test_paired_summary_skips_warmup_and_unpaired_runs():
    hist = [{"speedup/gen_per_step": 5.0, "speedup/step_per_step": 3.0}, {"speedup/gen_per_step": 1.1, "speedup/step_per_step": 1.05},
            {"speedup/gen_per_step": 1.3, "speedup/step_per_step": 1.15}]
    for h in hist:  # the running estimates logged beside them are not ratios: never read as such
        h["speedup/gen"], h["speedup/step"] = 77.0, 77.0
    s = paired_summary(hist, warmup=1)
    assert s["speedup/gen_mean"] == pytest.approx(math.sqrt(1.1 * 1.3))
    assert s["speedup/gen_n"] == 2
    assert s["speedup/step_mean"] == pytest.approx(math.sqrt(1.05 * 1.15))
    assert paired_summary([{"timing_s/gen": 1.0}]) == {}


def test_paired_summary_reads_runs_stored_before_the_per_step_keys():
    """Before issue #22 part 4 the per-step ratios were logged as ``speedup/gen`` itself."""
    old = [{"speedup/gen": 5.0, "speedup/step": 3.0}, {"speedup/gen": 1.1, "speedup/step": 1.05}, {"speedup/gen": 1.3, "speedup/step": 1.15}]
    assert per_step_ratios(old, "speedup/gen") == [5.0, 1.1, 1.3]
    assert paired_summary(old, warmup=1)["speedup/gen_mean"] == pytest.approx(math.sqrt(1.1 * 1.3))
    assert ratio_source({"speedup/gen", "speedup/gen_per_step"}, "speedup/gen") == "speedup/gen_per_step"
    assert ratio_source({"speedup/gen"}, "speedup/gen") == "speedup/gen" and per_step_key("speedup/step") == "speedup/step_per_step"


def test_running_speedups_end_on_the_runs_estimate():
    """``speedup/gen`` logged each step = geometric mean of the per-step ratios so far after warm-up
    (all of them inside the warm-up), so its last value is the run's ``speedup/gen_mean``."""
    ratios = [5.0, 1.1, 1.3, 0.9, 1.2]
    hist, logged = [], []
    for r in ratios:
        hist.append({"speedup/gen_per_step": r, "speedup/step_per_step": 1 + (r - 1) / 2})
        hist[-1].update(running_speedups(hist, warmup=1))
        logged.append(hist[-1]["speedup/gen"])
    assert logged[0] == pytest.approx(5.0) and logged[1] == pytest.approx(1.1) and logged[2] == pytest.approx(math.sqrt(1.1 * 1.3))
    summary = paired_summary(hist, warmup=1)
    assert logged[-1] == pytest.approx(summary["speedup/gen_mean"], rel=1e-12)
    assert hist[-1]["speedup/step"] == pytest.approx(summary["speedup/step_mean"], rel=1e-12)
    assert geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    assert running_speedups([{"timing_s/gen": 1.0}]) == {}  # not paired


def test_two_sample_detects_a_shift_and_not_noise():
    a = [0.50, 0.52, 0.48, 0.51, 0.49]
    same = two_sample(a, [0.49, 0.51, 0.50, 0.52, 0.48])
    assert same.p_value > 0.5 and same.diff == pytest.approx(0.0)
    shifted = two_sample(a, [x + 0.2 for x in a])
    assert shifted.p_value < 1e-4 and shifted.diff == pytest.approx(-0.2)
    # (1.959964 + 0.841621) * sqrt(2 * var / 5), var = 0.00025
    assert same.min_detectable == pytest.approx(2.801585 * math.sqrt(2 * 0.00025 / 5), rel=1e-5)
    with pytest.raises(ValueError, match="seed"):
        two_sample([1.0], [1.0, 2.0])
