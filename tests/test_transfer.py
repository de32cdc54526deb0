"""Transfer (issue #32 part 3): vLLM's speculative speedup predicted from our engine's acceptance and
vLLM's step costs (workbench.vllm.measure.transfer, pure), the cost runs' bookkeeping and the bench's
columns (workbench.vllm.measure.bench_transfer), on hand-computed numbers; no vLLM engine is started here
(tests/test_vllm_transfer.py runs one)."""

import math

import pytest

from workbench.rollout.counters import SpecCounters
from workbench.vllm.measure.bench_transfer import (
    StepRun,
    cost_prompts,
    repeat_costs,
    timed_steps,
    transfer_markdown,
    transfer_row,
)
from workbench.vllm.measure.transfer import (
    VLLMCosts,
    draft_shares,
    inside,
    per_row_speedup,
    predicted_plain_seconds,
    predicted_spec_seconds,
    predicted_speedup,
    prediction_ci,
    step_costs,
    tokens_per_row_step,
)

COSTS = VLLMCosts(plain_step_s=0.010, spec_step_s={3: 0.015}, plain_fixed_s=0.05, spec_fixed_s=0.06)


# ----------------------------------------------------------------- acceptance side


def test_tokens_per_row_step_counts_undrafted_row_steps_as_one_token():
    # 10 drafted row-steps accepting 15 drafts (E[N] = 2.5) and 5 undrafted ones (1 token each):
    # (10 * 2.5 + 5) / 15 = 2.0 = 1 + 15 / 15
    assert tokens_per_row_step(15, 15) == pytest.approx((10 * 2.5 + 5) / 15) == pytest.approx(2.0)
    assert tokens_per_row_step(0, 7) == 1.0
    with pytest.raises(ValueError, match="row_steps"):
        tokens_per_row_step(3, 0)
    with pytest.raises(ValueError, match="num_accepted"):
        tokens_per_row_step(-1, 4)


def test_per_row_speedup_is_tokens_per_step_times_the_cost_ratio():
    assert per_row_speedup(2.0, 0.010, 0.0125) == pytest.approx(1.6)
    with pytest.raises(ValueError, match="> 0"):
        per_row_speedup(2.0, 0.0, 0.01)
    with pytest.raises(ValueError, match=">= 1 token"):
        per_row_speedup(0.5, 0.01, 0.01)


def test_draft_shares_per_step_and_from_totals():
    # 4 rows at k=3 drafting all 12 slots, half of them, none; a tail step of 2 rows drafting all 6
    assert draft_shares([4, 4, 4, 2], [3, 3, 3, 3], [12, 6, 0, 6]) == [1.0, 0.5, 0.0, 1.0]
    assert draft_shares([4, 4], [0, 3], [0, 12]) == [0.0, 1.0]  # k_t = 0: a plain step (adaptive k)
    # counters without per-step drafts: the run's average share on every drafted step
    assert draft_shares([4, 4], [3, 3], [], num_draft_tokens=12) == [0.5, 0.5]
    for bad, match in [
        (([], [], []), "no decode steps"),
        (([4, 4], [3], [12, 12]), "one entry per step"),
        (([0], [3], [0]), ">= 1 row"),
        (([4], [3], None), "num_draft_tokens"),
    ]:
        with pytest.raises(ValueError, match=match):
            draft_shares(*bad)


def test_counters_keep_draft_tokens_per_step_and_merge_them():
    c = SpecCounters(k=3)
    c.add_step(4, 3, 4, 12, [4, 2, 1])
    c.add_step(4, 3, 0, 0, [0, 0, 0])  # an n-gram step without a match anywhere
    other = SpecCounters(k=3)
    other.add_step(2, 3, 1, 3, [1, 0, 0])
    c.merge(other)
    assert c.draft_tokens_per_step == [12, 0, 3] and c.rows_per_forward == [4, 4, 2] and c.k_per_step == [3, 3, 3]
    assert draft_shares(c.rows_per_forward, c.k_per_step, c.draft_tokens_per_step) == [1.0, 0.0, 0.5]


# ----------------------------------------------------------------- the step model


def test_predicted_speedup_by_hand_with_undrafted_steps_costed_as_plain():
    # plain: 0.05 + 63 * 0.010 = 0.68 s; speculative: 0.06 + 20 full steps * 0.015 + 4 undrafted
    # * 0.010 + 2 half-drafted * 0.0125 = 0.425 s; 0.68 / 0.425 = 1.6
    ks, shares = [3] * 26, [1.0] * 20 + [0.0] * 4 + [0.5] * 2
    assert predicted_plain_seconds(63, COSTS) == pytest.approx(0.68)
    assert predicted_spec_seconds(ks, shares, COSTS) == pytest.approx(0.425)
    assert predicted_speedup(63, ks, shares, COSTS) == pytest.approx(1.6)
    # had the undrafted steps cost a full speculative step, the prediction would be lower
    assert predicted_speedup(63, ks, [1.0] * 24 + [0.5] * 2, COSTS) < 1.6


def test_fixed_seconds_dilute_the_speedup_the_per_row_formula_ignores():
    no_fixed = VLLMCosts(0.010, {3: 0.015}, 0.0, 0.0)
    ks, shares = [3] * 21, [1.0] * 21  # 63 tokens in 21 steps: 3 tokens per row-step
    assert (
        predicted_speedup(63, ks, shares, no_fixed)
        == pytest.approx(per_row_speedup(3.0, 0.010, 0.015))
        == pytest.approx(2.0)
    )
    diluted = predicted_speedup(63, ks, shares, COSTS)
    assert diluted == pytest.approx(0.68 / (0.06 + 21 * 0.015)) and diluted < 2.0


def test_costs_and_steps_refuse_bad_input():
    with pytest.raises(ValueError, match="> 0 s"):
        VLLMCosts(0.0, {3: 0.01}, 0.0, 0.0)
    with pytest.raises(ValueError, match="> 0 s"):
        VLLMCosts(0.01, {}, 0.0, 0.0)
    with pytest.raises(ValueError, match=">= 0"):
        VLLMCosts(0.01, {3: 0.01}, -1.0, 0.0)
    with pytest.raises(ValueError, match="k=4 or above"):
        COSTS.step_s(4, 1.0)  # above the measured k: no extrapolation
    assert COSTS.step_s(0, 1.0) == COSTS.step_s(3, 0.0) == 0.010
    with pytest.raises(ValueError, match="plain_steps"):
        predicted_plain_seconds(0, COSTS)
    with pytest.raises(ValueError, match="one k_t per share"):
        predicted_spec_seconds([], [], COSTS)


def test_step_costs_reads_full_steps_at_the_full_batch_and_the_fixed_rest():
    # prefill, two full steps (12 = 4 rows * 3), a half-drafted one, a 2-row tail step
    step_s, rows, drafts = [0.05, 0.010, 0.016, 0.011, 0.020], [4, 4, 4, 4, 2], [0, 12, 12, 6, 6]
    t, fixed, used = step_costs(step_s, rows, drafts, 3, wall_s=0.2)
    assert t == pytest.approx(0.013) and used == 2
    assert fixed == pytest.approx(0.2 - (0.010 + 0.016 + 0.011 + 0.020))
    t0, _, used0 = step_costs(step_s, rows, None, 0, wall_s=0.2)  # plain: every decode step at 4 rows
    # the mean (wall times add up), not the median
    assert t0 == pytest.approx((0.010 + 0.016 + 0.011) / 3) and used0 == 3
    assert step_costs([0.05, 0.01], [4, 4], [0, 6], 3, 0.1)[0] is None  # no step drafted k on every row
    with pytest.raises(ValueError, match="decode step"):
        step_costs([0.05], [4], [0], 3, 0.1)
    with pytest.raises(ValueError, match="shorter"):
        step_costs([0.05, 0.3], [4, 4], [0, 12], 3, 0.1)
    with pytest.raises(ValueError, match="one entry per step"):
        step_costs([0.05, 0.01], [4], [0, 12], 3, 0.1)


def test_prediction_ci_widens_with_noisier_costs():
    ks, shares = [3] * 26, [1.0] * 26

    def ci(jitter):
        preds = [
            predicted_speedup(63, ks, shares, VLLMCosts(0.010 * (1 + j), {3: 0.015 * (1 - j)}, 0.05, 0.06))
            for j in (-jitter, 0.0, jitter, -jitter / 2, jitter / 2)
        ]
        return prediction_ci(preds)

    quiet, noisy = ci(0.01), ci(0.05)
    assert quiet.low < quiet.mean < quiet.high and noisy.low < noisy.mean < noisy.high
    assert noisy.half_width > 2 * quiet.half_width
    assert prediction_ci([1.3]).low is None  # one repeat: no interval
    with pytest.raises(ValueError):
        prediction_ci([])


def test_inside():
    assert inside(1.1, 1.0, 1.2) is True and inside(1.3, 1.0, 1.2) is False and inside(1.1, None, 1.2) is None


# ----------------------------------------------------------------- the bench's side


def test_cost_prompts_keep_lengths_and_the_first_token_and_repeat():
    p = [1, 10, 11, 12, 13, 14, 15, 16]
    (c,) = cost_prompts([p])
    assert len(c) == len(p) and c[0] == 1
    assert c == [1, 10, 11, 12, 10, 11, 12, 10]  # the first half of the body, repeated
    assert cost_prompts([[1], [1, 5]]) == [[1], [1, 5]]
    assert [len(x) for x in cost_prompts([[1, 2, 3], list(range(1, 30))])] == [3, 29]


class _Backend:
    """generate_steps as vLLM's engine gives it: yields after each step, returns an output whose
    counters list rows and draft tokens per step (the prefill first)."""

    def generate_steps(self, prompts, sampling):
        from workbench.rollout.engine import RolloutOutput

        for _ in range(3):
            yield
        c = SpecCounters(k=3)
        c.rows_per_forward, c.draft_tokens_per_step = [2, 2, 2], [0, 6, 6]
        return RolloutOutput([[5]] * 2, [[0.0]] * 2, ["length"] * 2, c)


def test_timed_steps_times_each_engine_step():
    run = timed_steps(_Backend(), [[1], [1]], None)
    assert len(run.step_s) == 3 and run.rows == [2, 2, 2] and run.draft_tokens == [0, 6, 6]
    assert run.wall_s >= sum(run.step_s) > 0 and run.out.tokens == [[5], [5]]


def _run(step_ms, rows, drafts, fixed_ms=40.0):
    s = [x / 1e3 for x in step_ms]
    return StepRun(fixed_ms / 1e3 + sum(s[1:]), s, rows, drafts, None)


def _counters(k, rows, drafts, accepted):
    c = SpecCounters(k=k)
    for r, m, a in zip(rows, drafts, accepted):
        c.add_step(r, k, r if m else 0, m, [a] + [0] * (k - 1) if k else [])
    return c


def test_transfer_row_by_hand():
    # cost runs, 3 repeats: plain 10 ms a step, speculative 15 ms a full step; fixed 40 ms each
    plain = _run([30] + [10] * 8, [4] * 9, [0] * 9)
    spec = _run([30] + [15] * 4 + [11], [4] * 6, [0] + [12] * 4 + [6])
    runs = [(plain, spec)] * 3
    ours_spec = _counters(3, [4] * 21, [12] * 21, [8] * 21)  # 21 full steps of 4 rows accepting 8 drafts each
    ours_ar = _counters(0, [4] * 63, [0] * 63, [0] * 63)
    vllm_spec = _counters(3, [4] * 22, [0] + [12] * 21, [0] + [8] * 21)  # its first step is the prefill
    vllm_ar = _counters(0, [4] * 64, [0] * 64, [0] * 64)
    measured = {"mean": 1.2, "lo": 1.1, "hi": 1.3}
    row = transfer_row(3, runs, ours_spec, ours_ar, vllm_spec, vllm_ar, measured)
    expect = (0.04 + 63 * 0.010) / (0.04 + 21 * 0.015)
    p = row["vllm_predicted_speedup"]
    assert p["mean"] == pytest.approx(expect) and p["lo"] == pytest.approx(expect)  # identical repeats: a zero-width CI
    assert row["vllm_predicted_in_ci"] is (1.1 <= expect <= 1.3)
    assert row["vllm_predicted_from_vllm_acceptance"]["mean"] == pytest.approx(expect)  # the same steps
    tau = 1 + 21 * 8 / (21 * 4)
    assert row["vllm_predicted_speedup_per_row"]["mean"] == pytest.approx(tau * 10 / 15)
    t = row["transfer"]
    assert t["plain_step_ms"] == pytest.approx(10) and t["spec_step_ms"] == pytest.approx(15)
    assert t["plain_fixed_ms"] == pytest.approx(40) and t["spec_fixed_ms"] == pytest.approx(40)
    assert (
        t["repeats_used"] == 3
        and t["full_steps_min"] == 4
        and t["ours_spec_steps"] == 21
        and t["vllm_spec_steps"] == 21
    )
    assert t["ours_tokens_per_row_step"] == pytest.approx(tau) and t["plain_steps"] == 63


def test_transfer_row_skips_repeats_without_a_full_step_and_says_so():
    plain = _run([30] + [10] * 8, [4] * 9, [0] * 9)
    full = _run([30] + [15] * 4, [4] * 5, [0] + [12] * 4)
    partial = _run([30] + [12] * 4, [4] * 5, [0] + [6] * 4)
    ours = _counters(3, [4] * 21, [12] * 21, [8] * 21)
    ar = _counters(0, [4] * 63, [0] * 63, [0] * 63)
    row = transfer_row(3, [(plain, full), (plain, partial)], ours, ar, ours, ar, {"mean": 1.0, "lo": 0.9, "hi": 1.1})
    assert row["transfer"]["repeats_used"] == 1 and row["transfer"]["full_steps_min"] == 0
    assert row["vllm_predicted_speedup"]["lo"] is None and row["vllm_predicted_ci_overlap"] is None
    none = transfer_row(3, [(plain, partial)], ours, ar, ours, ar, {"mean": 1.0, "lo": 0.9, "hi": 1.1})
    assert none["vllm_predicted_speedup"] is None and none["vllm_predicted_in_ci"] is None


def test_transfer_row_without_decode_steps_has_no_prediction():
    prefill_only = _run([30], [4], [0])
    row = transfer_row(
        3,
        [(prefill_only, prefill_only)],
        SpecCounters(k=3),
        SpecCounters(k=0),
        SpecCounters(k=3),
        SpecCounters(k=0),
        {"mean": 1.0, "lo": 0.9, "hi": 1.1},
    )
    assert (
        row["vllm_predicted_speedup"] is None
        and row["vllm_predicted_in_ci"] is None
        and "max_new_tokens" in row["transfer"]["note"]
    )
    assert "| - | - |" in "\n".join(transfer_markdown([_vllm_row(**row)]))


def _vllm_row(**extra):
    ci = {"mean": 1.09, "lo": 1.07, "hi": 1.11}
    return {
        "batch": 4,
        "drafter": "ngram",
        "k": 3,
        "ours_ar_tok_s": 300.0,
        "vllm_ar_tok_s": 600.0,
        "ours_over_vllm_ar": ci,
        "ours_spec_greedy_tok_s": 390.0,
        "vllm_spec_greedy_tok_s": 680.0,
        "ours_over_vllm_spec_greedy": ci,
        "ours_spec_speedup": ci,
        "vllm_spec_speedup": ci,
        "ours_acceptance_length": 2.1,
        "vllm_acceptance_length": 2.1,
        "greedy_identical": True,
        **extra,
    }


def test_markdown_gains_the_prediction_columns_and_old_results_render_as_before():
    from workbench.vllm.measure.bench import vllm_markdown

    old = "\n".join(vllm_markdown([_vllm_row()], {}))
    assert "vLLM predicted" not in old and "Transfer" not in old
    pred = {"mean": 1.10, "lo": 1.08, "hi": 1.12}
    row = _vllm_row(
        vllm_predicted_speedup=pred,
        vllm_predicted_in_ci=True,
        vllm_predicted_ci_overlap=True,
        vllm_predicted_speedup_per_row={"mean": 1.25, "lo": 1.2, "hi": 1.3},
        vllm_predicted_from_vllm_acceptance=None,
        transfer={
            "plain_step_ms": 6.1,
            "spec_step_ms": 9.5,
            "plain_fixed_ms": 20.0,
            "spec_fixed_ms": 25.0,
            "repeats_used": 5,
            "repeats": 5,
            "full_steps_min": 9,
            "ours_spec_steps": 30,
            "vllm_spec_steps": 31,
        },
    )
    md = vllm_markdown([row], {})
    header = next(x for x in md if x.startswith("| batch | ours AR"))
    line = next(x for x in md if x.startswith("| 4 | 300"))
    assert header.endswith("| vLLM predicted | inside CI |") and header.count("|") == line.count("|")
    assert line.endswith("| 1.10× [1.08, 1.12] | yes |")
    table = md[md.index(next(x for x in md if x.startswith("| batch | vLLM measured"))) :]
    assert table[2] == (
        "| 4 | 1.09× [1.07, 1.11] | 1.10× [1.08, 1.12] | yes | 1.25× [1.20, 1.30] | - | 30 / 31 | 6.10 | 9.50 | "
        "20.0 / 25.0 | 9 | 5/5 |"
    )
    assert transfer_markdown([_vllm_row()]) == []


def test_no_transfer_needs_vllm():
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["bench", "micro", "--no-transfer"])
    assert res.exit_code == 2 and "--no-transfer needs --vllm" in res.output


def test_repeat_costs_from_one_pair_of_runs():
    plain = _run([30] + [10] * 4, [4] * 5, [0] * 5, fixed_ms=35.0)
    spec = _run([30] + [15, 15, 9], [4] * 4, [0, 12, 12, 3], fixed_ms=45.0)
    c, used = repeat_costs(plain, spec, 3)
    assert used == 2 and c.plain_step_s == pytest.approx(0.010) and c.spec_step_s == {3: pytest.approx(0.015)}
    assert math.isclose(c.plain_fixed_s, 0.035) and math.isclose(c.spec_fixed_s, 0.045)


def test_vllm_bench_spec_schedules_the_widest_batch():
    from workbench.specs.load import load_spec
    from workbench.vllm.measure.bench import vllm_bench_spec

    spec = load_spec("membound")
    assert spec.rollout.max_batch_size == 4
    s = vllm_bench_spec(spec, "ngram", 2, [1, 4, 16])
    assert s.rollout.max_batch_size == 16 and s.drafter.kind == "ngram" and s.drafter.k == 2
    assert vllm_bench_spec(spec, "draft_model", 3, [1, 2]).rollout.max_batch_size == 4  # never narrower than the spec
    assert spec.rollout.max_batch_size == 4  # the bench's own spec untouched


# ----------------------------------------------------------------- settings vLLM cannot run (--vllm-predict)


def test_a_smaller_k_is_priced_affine_in_its_draft_tokens_from_the_next_measured_k():
    """Adaptive k's k_t < K: t_v(b,0) + (t_v(b,K) - t_v(b,0))·share·k_t/K, from the smallest measured K > k_t."""
    assert COSTS.step_s(1, 1.0) == pytest.approx(0.010 + 0.005 / 3)
    assert COSTS.step_s(2, 0.5) == pytest.approx(0.010 + 0.005 * 0.5 * 2 / 3)
    two = VLLMCosts(0.010, {2: 0.012, 4: 0.020}, 0.0, 0.0)
    assert two.step_s(1, 1.0) == pytest.approx(0.011) and two.step_s(3, 1.0) == pytest.approx(0.010 + 0.010 * 3 / 4)
    assert two.step_s(2, 1.0) == 0.012  # a measured k is read, not interpolated


def test_predict_setting_prices_adaptive_steps_and_undrafted_ones():
    from workbench.vllm.measure.bench_transfer import predict_setting

    plain = _run([30] + [10] * 8, [4] * 9, [0] * 9)
    spec = _run([30] + [15] * 4, [4] * 5, [0] + [12] * 4)
    ar = _counters(0, [4] * 63, [0] * 63, [0] * 63)
    c = SpecCounters(k=3)  # adaptive: 10 plain steps, 10 at k_t = 1, 10 at k_t = 3 (2 of 4 rows drafting)
    for k_t, m, acc in [(0, 0, 0)] * 10 + [(1, 4, 3)] * 10 + [(3, 6, 4)] * 10:
        c.add_step(4, k_t, m // max(k_t, 1), m, [acc] + [0] * (k_t - 1) if k_t else [])
    p = predict_setting(3, [(plain, spec)] * 2, c, ar)
    spec_s = 0.04 + 10 * 0.010 + 10 * (0.010 + 0.005 / 3) + 10 * (0.010 + 0.005 * 0.5)
    assert p["vllm_predicted_speedup"]["mean"] == pytest.approx((0.04 + 63 * 0.010) / spec_s)
    assert p["k_used"] == [0, 1, 3] and p["ours_undrafted_steps"] == 10 and p["repeats_used"] == 2
    assert p["ours_tokens_per_row_step"] == pytest.approx(1 + 70 / 120)
    assert predict_setting(3, [(plain, spec)], SpecCounters(k=3), SpecCounters(k=0))["vllm_predicted_speedup"] is None


def test_group_prompts_lays_the_batch_out_as_grpo_groups():
    from workbench.vllm.measure.bench import group_prompts

    ps = [[1, i] for i in range(10)]
    assert group_prompts(ps[:8], 4) == [[1, 0]] * 4 + [[1, 1]] * 4
    assert group_prompts(ps[:6], 4) == [[1, 0]] * 4 + [[1, 1]] * 2  # the last group cut to fill B
    assert group_prompts(ps[:1], 8) == [[1, 0]]


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--vllm-predict", "suffix"], "needs --vllm DRAFTER"),
        (["--vllm", "draft_model", "--vllm-predict", "suffix"], "use --vllm ngram"),
        (["--vllm", "ngram", "--vllm-predict", "eagle"], "allowed values: suffix, adaptive"),
        (["--vllm", "ngram", "--no-transfer", "--vllm-predict", "adaptive"], "drop --no-transfer"),
    ],
)
def test_vllm_predict_is_refused_without_a_cost_proxy(args, msg):
    from typer.testing import CliRunner

    from workbench.cli import app

    res = CliRunner().invoke(app, ["bench", "micro", *args])
    assert res.exit_code == 2 and msg in " ".join(res.output.split()), res.output


def test_predictions_table_renders_one_line_per_batch_and_setting():
    from workbench.vllm.measure.bench_transfer import predictions_markdown

    assert predictions_markdown([_vllm_row()]) == []
    p = {
        "setting": "suffix",
        "proxy": "vLLM ngram k=3",
        "ours_spec_speedup": {"mean": 1.3, "lo": 1.2, "hi": 1.4},
        "acceptance_length": 2.5,
        "ours_tokens_per_row_step": 1.8,
        "vllm_predicted_speedup": {"mean": 1.1, "lo": 1.0, "hi": 1.2},
        "ours_spec_steps": 30,
        "ours_undrafted_steps": 4,
        "k_used": [0, 3],
    }
    md = predictions_markdown([_vllm_row(vllm_predicted_for=[p])])
    assert (
        md[-1]
        == "| 4 | suffix | 1.30× [1.20, 1.40] | 2.50 | 1.80 | 1.10× [1.00, 1.20] | 30 | 4 | 0,3 | vLLM ngram k=3 |"
    )


def test_t_v_is_fitted_on_draft_counts_where_no_step_had_every_row_drafting():
    from workbench.vllm.measure.transfer import fitted_step_cost

    # 4 rows, k = 3: steps with 0, 4, 8 draft tokens cost 10 + 0.5 ms per draft token; read at m = 12
    step_s = [0.03] + [0.010, 0.012, 0.014, 0.012, 0.010]
    rows, drafts = [4] * 6, [0, 0, 4, 8, 4, 0]
    assert fitted_step_cost(step_s, rows, drafts, 3) == pytest.approx(0.016)
    # tail steps (fewer rows) left out
    assert fitted_step_cost(step_s, [4, 2, 4, 4, 4, 4], drafts, 3) == pytest.approx(0.016)
    assert fitted_step_cost([0.03, 0.01, 0.01], [4, 4, 4], [0, 6, 6], 3) is None  # one draft count: no slope
    assert fitted_step_cost([0.03, 0.01, 0.01], [4, 4, 4], [0, 0, 0], 3) is None  # no drafts at all
    plain = _run([30] + [10] * 8, [4] * 9, [0] * 9)
    spec = _run([30, 10, 12, 14, 12, 10], [4] * 6, drafts)
    c, used = repeat_costs(plain, spec, 3)
    assert used == 0 and c.spec_step_s[3] == pytest.approx(0.016) and c.plain_step_s == pytest.approx(0.010)
