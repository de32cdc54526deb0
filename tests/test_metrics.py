"""workbench.metrics names every key the writers log: the rollout counters and the stage timer
write literals (the rollout layer imports nothing above it), so their keys are pinned here."""

from workbench import metrics as M
from workbench.grpo.completions import completion_metrics
from workbench.rollout.counters import SpecCounters
from workbench.timing import StageTimer


def test_spec_counters_keys_are_named():
    c = SpecCounters(k=2)
    c.add_step(rows=3, k_t=2, num_drafts=3, num_draft_tokens=6, accepted_per_pos=[2, 1])
    c.add_step(rows=1, k_t=1, num_drafts=1, num_draft_tokens=1, accepted_per_pos=[1, 0])
    assert set(c.metrics()) == {
        M.ACCEPTANCE_LENGTH,
        M.ACCEPTANCE_RATE,
        M.NUM_DRAFTS,
        M.NUM_DRAFT_TOKENS,
        M.NUM_ACCEPTED_TOKENS,
        M.acceptance_rate_pos(0),
        M.acceptance_rate_pos(1),
    }
    km = c.k_metrics()
    assert {M.K_MEAN, M.k_frac(0), M.k_frac(1), M.k_frac(2)} <= set(km)
    assert {M.suffix_int(k, M.K_MEAN_BY_ROWS) for k in km if k.startswith(M.K_MEAN_BY_ROWS)} == {1, 4}


def test_stage_timer_keys_are_named():
    t = StageTimer()
    t.start_step()
    with t.stage("gen"):
        pass
    m = t.end_step()
    assert {M.GEN_S, M.STEP_S, M.OTHER_S, M.GEN_FRAC} <= set(m)


def test_completion_keys_are_named():
    assert set(completion_metrics([3, 5], ["stop", "length"])) == {
        M.COMPLETIONS_MEAN_LENGTH,
        M.COMPLETIONS_MIN_LENGTH,
        M.COMPLETIONS_MAX_LENGTH,
        M.COMPLETIONS_CLIPPED_RATIO,
        M.COMPLETIONS_FRAC_STOP,
    }


def test_names_are_the_stored_histories_names():
    """Never renamed: MLflow histories are read back by these names."""
    assert (M.GEN_S, M.ACCEPTANCE_LENGTH, M.acceptance_rate_pos(3), M.REWARD_MEAN, M.EVAL_ACCURACY) == (
        "timing_s/gen",
        "spec/acceptance_length",
        "spec/acceptance_rate_pos_3",
        "reward/mean",
        "eval/accuracy",
    )
    assert all(p.endswith("/") for p in M.HISTORY_PREFIXES)
