"""wb simulate: acceptance falling with context length (workbench/perf/simulate/context.py), by hand."""

import math

import numpy as np
import pytest

from workbench.perf.simulate.context import (
    alpha_profile,
    fit_alpha_ref,
    mean_steps,
    relative,
    row_steps_ctx,
    stage_acceptance,
    step_integrals,
)
from workbench.perf.simulate.rollout import gen_stage, row_steps, tokens_per_step_var
from workbench.perf.simulate.scenario import Speculation, load_scenario
from workbench.rollout.cost import alpha_from_acceptance_length, expected_tokens


def test_relative_interpolates_and_is_flat_outside():
    t = {1000: 3.0, 3000: 2.0}  # accepted drafts 2 -> 1 per step
    assert relative(t, np.array([0.0, 500, 1000, 2000, 3000, 9000])).tolist() == [1, 1, 1, 0.75, 0.5, 0.5]
    with pytest.raises(ValueError, match="first entry must exceed 1"):
        relative({0: 1.0, 10: 1.0}, np.array([0.0]))


def test_alpha_profile_by_hand():
    # k_table = 1: E[N] − 1 = α, so α(c) = r(c) · α_ref exactly
    a = alpha_profile(0.8, {0: 2.0, 1000: 1.5}, 1, np.array([0.0, 500, 1000, 5000]))
    assert a == pytest.approx([0.8, 0.6, 0.4, 0.4], abs=1e-3)
    # k_table = 3: α(c) has α + α² + α³ = r · (that of α_ref)
    a3 = alpha_profile(0.7, {0: 2.5, 100: 2.0}, 3, np.array([100.0]))[0]
    assert a3 + a3**2 + a3**3 == pytest.approx((1.0 / 1.5) * (0.7 + 0.49 + 0.343), rel=1e-3)


def test_step_integral_by_hand():
    # k_table = k = 1, α linear from 0.8 (c = 0) to 0.4 (c = 10000): E = 1.8 − 0.4 c/10⁴,
    # ∫₀^10⁴ dc / E = (10⁴/0.4) ln(1.8/1.4)
    c, f, v = step_integrals(0.8, {0: 1.8, 10000: 1.4}, 1, 1, 10000)
    assert np.interp(10000, c, f) == pytest.approx(25000 * math.log(1.8 / 1.4), rel=1e-4)
    # k = 1: N ∈ {1, 2}, Var(N) = α(1 − α); V = ∫ α(1 − α)/(1 + α)³ dc with α = 0.8 − 0.4 c/10⁴: substitute
    # u = 1 + α (dc = −2.5·10⁴ du), α(1 − α) = (u − 1)(2 − u): V = 2.5·10⁴ ∫_{1.4}^{1.8} (−u² + 3u − 2)/u³ du
    g = lambda u: -math.log(u) - 3 / u + 1 / u**2  # noqa: E731 - antiderivative of (−u² + 3u − 2)/u³
    assert np.interp(10000, c, v) == pytest.approx(25000 * (g(1.8) - g(1.4)), rel=1e-4)
    assert (np.diff(f) > 0).all() and (np.diff(v) >= 0).all()


def test_flat_table_gives_the_constant_acceptance_row_steps():
    lengths = np.array([1, 2, 50, 400, 3000])
    alpha, k = 0.7, 3
    grid = step_integrals(alpha, {0: expected_tokens(alpha, 3)}, 3, k, 200 + 3000)
    m, var = mean_steps(lengths, 200, grid)
    e = expected_tokens(alpha, k)
    spec = Speculation(alpha=alpha)
    assert m == pytest.approx((lengths - 1) / e, abs=1e-9)
    assert var == pytest.approx((lengths - 1) * tokens_per_step_var(spec, k) / e**3, abs=1e-9)
    same = row_steps_ctx(lengths, 200, grid, k, np.random.default_rng(5))
    assert same.tolist() == row_steps(lengths, e, tokens_per_step_var(spec, k), k, np.random.default_rng(5)).tolist()


def test_fit_alpha_ref_reaches_the_measured_stage_acceptance():
    lengths = np.random.default_rng(0).integers(100, 12000, 500)
    flat = fit_alpha_ref(lengths, 200, {0: 2.0}, 3, 3, 2.47)
    assert flat == pytest.approx(alpha_from_acceptance_length(2.47, 3), abs=1e-4)
    decay = {2048: 2.295, 8192: 1.687, 16384: 1.090}
    a = fit_alpha_ref(lengths, 200, decay, 3, 3, 2.05)
    assert stage_acceptance(lengths, 200, a, decay, 3, 3) == pytest.approx(2.05, abs=1e-4)
    assert a > alpha_from_acceptance_length(2.05, 3)  # short contexts accept more than the stage's mean
    with pytest.raises(ValueError, match="cannot be reached"):
        fit_alpha_ref(lengths, 200, {0: 2.0, 2000: 1.01}, 3, 3, 3.9)


def test_scenario_validation():
    with pytest.raises(ValueError, match="acceptance_vs_context"):
        Speculation(per_position=[0.7, 0.5], acceptance_vs_context={0: 2.0})
    with pytest.raises(ValueError, match=r"acceptance length in \[1, k\+1\]"):
        Speculation(alpha=0.7, acceptance_vs_context={0: 5.0})
    with pytest.raises(ValueError, match="at a single k"):
        Speculation(acceptance_length={3: 2.4, 5: 2.9}, acceptance_vs_context={0: 2.0})
    with pytest.raises(
        ValueError, match="rises above its first entry"
    ):  # 3x the accepted drafts of α_ref = 0.9: past all of them
        alpha_profile(0.9, {0: 1.5, 1000: 2.5}, 3, np.array([2000.0]))


def test_decay_slows_only_the_speculative_arm_and_more_at_large_k():
    # the context fit takes one measured k
    one_k = [
        "workload.prompts=64",
        "speculation.acceptance_length={3: 2.47}",
        "variants={}",
    ]
    _, flat = load_scenario("qwen3-8b-gb200", one_k)
    _, same = load_scenario("qwen3-8b-gb200", [*one_k, "speculation.acceptance_vs_context={0: 2.47}"])
    _, decay = load_scenario("qwen3-8b-gb200", [*one_k, "speculation.acceptance_vs_context={2048: 2.295, 16384: 1.09}"])
    ar = gen_stage(flat, 0).seconds
    assert gen_stage(same, 0).seconds == ar == gen_stage(decay, 0).seconds
    # flat table: the same stage
    assert gen_stage(same, 3).seconds == pytest.approx(gen_stage(flat, 3).seconds, rel=5e-3)
    assert gen_stage(decay, 3).tokens_per_step == pytest.approx(2.47, abs=0.02)  # fitted to the measured mean
    speedup = {k: ar / gen_stage(decay, k).seconds for k in (3, 7)}
    flat_speedup = {k: ar / gen_stage(flat, k).seconds for k in (3, 7)}
    assert speedup[3] < flat_speedup[3] and speedup[7] / speedup[3] < flat_speedup[7] / flat_speedup[3]
