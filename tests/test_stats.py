"""Paired ratios, their confidence intervals and the decisions drawn from them, against values
computed by hand (t quantiles from tables)."""

import math

import pytest

from workbench.stats import (
    RatioCI,
    after_warmup,
    decide,
    dersimonian_laird_tau2,
    geometric_mean,
    hartung_knapp,
    paired_ratios,
    paired_summary,
    per_step_key,
    per_step_ratios,
    random_effects,
    ratio_ci,
    ratio_source,
    run_log_estimate,
    running_speedups,
    runs_ci,
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
    assert step_ratios([10.0], [6.0], [9.0], [2.0]) == [pytest.approx(1.1)]  # online drafter training charged
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


def test_decide_names_no_best_for_a_lone_point_without_an_interval():
    # an unpaired sweep (learn.yaml: measure.paired=false) has one speculative row and no CI: no "best"
    d = decide({"draft_model": RatioCI(1.01, None, None, 0, None)})
    assert d.best is None and d.tied == () and d.top == "draft_model"
    assert decide({"draft_model": RatioCI(1.3, 1.2, 1.4, 5, 0.1)}).best == "draft_model"


def test_paired_summary_skips_warmup_and_unpaired_runs():
    hist = [
        {"speedup/gen_per_step": 5.0, "speedup/step_per_step": 3.0},
        {"speedup/gen_per_step": 1.1, "speedup/step_per_step": 1.05},
        {"speedup/gen_per_step": 1.3, "speedup/step_per_step": 1.15},
    ]
    for h in hist:  # the running estimates logged beside them are not ratios: never read as such
        h["speedup/gen"], h["speedup/step"] = 77.0, 77.0
    s = paired_summary(hist, warmup=1)
    assert s["speedup/gen_mean"] == pytest.approx(math.sqrt(1.1 * 1.3))
    assert s["speedup/gen_n"] == 2
    assert s["speedup/step_mean"] == pytest.approx(math.sqrt(1.05 * 1.15))
    assert paired_summary([{"timing_s/gen": 1.0}]) == {}


def test_paired_summary_reads_runs_stored_before_the_per_step_keys():
    """Before issue #22 part 4 the per-step ratios were logged as ``speedup/gen`` itself."""
    old = [
        {"speedup/gen": 5.0, "speedup/step": 3.0},
        {"speedup/gen": 1.1, "speedup/step": 1.05},
        {"speedup/gen": 1.3, "speedup/step": 1.15},
    ]
    assert per_step_ratios(old, "speedup/gen") == [5.0, 1.1, 1.3]
    assert paired_summary(old, warmup=1)["speedup/gen_mean"] == pytest.approx(math.sqrt(1.1 * 1.3))
    assert ratio_source({"speedup/gen", "speedup/gen_per_step"}, "speedup/gen") == "speedup/gen_per_step"
    assert (
        ratio_source({"speedup/gen"}, "speedup/gen") == "speedup/gen"
        and per_step_key("speedup/step") == "speedup/step_per_step"
    )


def test_running_speedups_end_on_the_runs_estimate():
    """``speedup/gen`` logged each step = geometric mean of the per-step ratios so far after warm-up
    (all of them inside the warm-up), so its last value is the run's ``speedup/gen_mean``."""
    ratios = [5.0, 1.1, 1.3, 0.9, 1.2]
    hist, logged = [], []
    for r in ratios:
        hist.append({"speedup/gen_per_step": r, "speedup/step_per_step": 1 + (r - 1) / 2})
        hist[-1].update(running_speedups(hist, warmup=1))
        logged.append(hist[-1]["speedup/gen"])
    assert (
        logged[0] == pytest.approx(5.0)
        and logged[1] == pytest.approx(1.1)
        and logged[2] == pytest.approx(math.sqrt(1.1 * 1.3))
    )
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


# ----------------------------------------------------------------------------- a random-effects interval over runs

# BCG vaccine trials (Colditz et al. 1994; metafor's dat.bcg): tpos, tneg, cpos, cneg per trial.
BCG = [
    (4, 119, 11, 128),
    (6, 300, 29, 274),
    (3, 228, 11, 209),
    (62, 13536, 248, 12619),
    (33, 5036, 47, 5761),
    (180, 1361, 372, 1079),
    (8, 2537, 10, 619),
    (505, 87886, 499, 87892),
    (29, 7470, 45, 7232),
    (17, 1699, 65, 1600),
    (186, 50448, 141, 27197),
    (5, 2493, 3, 2338),
    (27, 16886, 29, 17825),
]


def bcg_log_risk_ratios():
    """metafor's escalc(measure="RR"): yi = log risk ratio, vi = 1/a - 1/(a+b) + 1/c - 1/(c+d)."""
    y = [math.log((a / (a + b)) / (c / (c + d))) for a, b, c, d in BCG]
    v = [1 / a - 1 / (a + b) + 1 / c - 1 / (c + d) for a, b, c, d in BCG]
    return y, v


def test_random_effects_match_metafor_on_the_bcg_example():
    """Published outputs: rma(yi, vi, method="DL") gives tau² 0.3088 and estimate -0.7141 (metafor's
    tests/testthat/test_misc_metan_vs_rma.uni_with_dat.bcg.r, checked against Stata's metan);
    rma(yi, vi, test="knha") (REML tau² 0.3132) gives estimate -0.7145, se 0.1808, 95 % CI
    [-1.1084, -0.3206] on t(12) (metafor README)."""
    y, v = bcg_log_risk_ratios()
    assert dersimonian_laird_tau2(y, v) == pytest.approx(0.3088, abs=5e-5)
    assert math.log(random_effects(y, v).mean) == pytest.approx(-0.7141, abs=5e-5)
    mu, se = hartung_knapp(y, v, 0.3132)
    assert mu == pytest.approx(-0.7145, abs=5e-5) and se == pytest.approx(0.1808, abs=5e-5)
    t12 = 2.178813  # t_{0.975, 12}
    assert (mu - t12 * se, mu + t12 * se) == (pytest.approx(-1.1084, abs=1e-4), pytest.approx(-0.3206, abs=1e-4))


def test_random_effects_by_hand():
    # y 0.1, 0.2, 0.3 with v 0.001 each: w 1000, Q = 1000 * 0.02 = 20, C = 3000 - 3e6/3000 = 2000,
    # tau² = (20 - 2) / 2000 = 0.009; weights 1/0.01 = 100, mu 0.2, q = 100 * 0.02 / 2 = 1, se = sqrt(1/300)
    r = random_effects([0.1, 0.2, 0.3], [0.001] * 3)
    se, t2, t1 = math.sqrt(1 / 300), 4.302653, 12.706205  # t_{0.975, 2}, t_{0.975, 1}
    assert r.tau == pytest.approx(math.sqrt(0.009)) and r.n == 3 and r.mean == pytest.approx(math.exp(0.2))
    assert (r.low, r.high) == (
        pytest.approx(math.exp(0.2 - t2 * se), rel=1e-6),
        pytest.approx(math.exp(0.2 + t2 * se), rel=1e-6),
    )
    hp = t1 * math.sqrt(0.009 + se * se + 0.001)  # a new run's estimate: tau² + se² + its own step noise
    assert (r.pred_low, r.pred_high) == (
        pytest.approx(math.exp(0.2 - hp), rel=1e-6),
        pytest.approx(math.exp(0.2 + hp), rel=1e-6),
    )
    assert r.half_width == pytest.approx(math.exp(t2 * se) - 1, rel=1e-6) and r.ratio_ci().n == 3


def test_prediction_interval_uses_the_plain_standard_error():
    # y 0.0, 0.2, 0.5 with v 0.01, 0.02, 0.04: w 100, 50, 25 (Σ 175), fixed mean 22.5/175,
    # Q = Σ w (y - fixed)², C = 175 - (100² + 50² + 25²)/175 = 100, tau² = (Q - 2) / C
    y, v = [0.0, 0.2, 0.5], [0.01, 0.02, 0.04]
    fixed = 22.5 / 175
    tau2 = (sum(wi * (yi - fixed) ** 2 for wi, yi in zip((100, 50, 25), y)) - 2) / 100
    w = [1 / (x + tau2) for x in v]
    mu = sum(wi * yi for wi, yi in zip(w, y)) / sum(w)
    q_hk = sum(wi * (yi - mu) ** 2 for wi, yi in zip(w, y)) / 2
    r = random_effects(y, v)
    assert tau2 > 0 and r.tau == pytest.approx(math.sqrt(tau2)) and abs(q_hk - 1) > 0.05  # HK's se is not SE here
    assert r.high == pytest.approx(math.exp(mu + 4.302653 * math.sqrt(max(q_hk, 1) / sum(w))), rel=1e-6)
    hp = 12.706205 * math.sqrt(tau2 + 1 / sum(w) + 0.07 / 3)  # Higgins et al. 2009: SE² = 1/Σw, t on n-2 df
    assert r.pred_high == pytest.approx(math.exp(mu + hp), rel=1e-6) and r.pred_low == pytest.approx(
        math.exp(mu - hp), rel=1e-6
    )


def test_no_between_run_spread_reduces_to_the_fixed_effect_interval():
    # y 0.10, 0.11 with v 0.01, 0.04: w 100, 25, fixed mean 0.102, Q = 0.002 < n - 1, so tau² = 0;
    # HKSJ's q = 0.002 is floored at 1: se = sqrt(1 / 125), the fixed-effect one, on t(1)
    r = random_effects([0.10, 0.11], [0.01, 0.04])
    h = 12.706205 * math.sqrt(1 / 125)
    assert r.tau == 0.0 and r.mean == pytest.approx(math.exp(0.102))
    assert r.low == pytest.approx(math.exp(0.102 - h), rel=1e-6) and r.high == pytest.approx(
        math.exp(0.102 + h), rel=1e-6
    )
    assert r.pred_low is None and r.pred_high is None  # a prediction interval needs >= 3 runs (t on n - 2 df)


def test_runs_ci_sees_the_spread_that_pooled_steps_do_not():
    """Three runs with tight steps but different levels (1.20, 1.30, 1.40): the pooled per-step interval
    is narrow around 1.30 and misses the runs' spread; the random-effects one spans it."""
    runs = [[1.19, 1.21, 1.20, 1.205], [1.29, 1.31, 1.30, 1.295], [1.39, 1.41, 1.40, 1.405]]
    pooled, re = ratio_ci([x for r in runs for x in r]), runs_ci(runs)
    assert re.tau > 0.05 and re.high - re.low > 2 * (pooled.high - pooled.low)
    assert re.low < 1.2 and re.high > 1.4 and re.mean == pytest.approx(pooled.mean, rel=0.01)
    m, var = run_log_estimate(runs[0])
    assert m == pytest.approx(sum(math.log(x) for x in runs[0]) / 4)
    assert var == pytest.approx(sum((math.log(x) - m) ** 2 for x in runs[0]) / 3 / 4)


def test_random_effects_refuse_what_they_cannot_estimate():
    with pytest.raises(ValueError, match="per-step"):
        random_effects([0.1], [0.01])  # one run: no between-run spread, its per-step CI is all there is
    with pytest.raises(ValueError):
        random_effects([0.1, 0.2], [0.01])
    with pytest.raises(ValueError, match="> 0"):
        random_effects([0.1, 0.2], [0.01, 0.0])
    with pytest.raises(ValueError, match=">= 2 ratios"):
        run_log_estimate([1.2])
    with pytest.raises(ValueError, match="all equal"):
        run_log_estimate([1.2, 1.2, 1.2])
