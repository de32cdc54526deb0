"""The names of the metrics the workbench logs to MLflow: one place for every key, its meaning, its unit.

Writers (the trainer, the stage timer, rewards, completions, online adaptation, the paired timer)
and readers (``runs.py``, ``report/``, ``sweep/``, ``perf/``) spell a key through this module, never as
a literal. The names are the MLflow histories' names: never rename one (stored runs would lose it).
Imports nothing of the project (the bottom layer).

| name | meaning | unit |
|---|---|---|
| ``timing_s/<stage>`` (``gen``, ``train``, ``ref``, ``eval``, ``gen_autoregressive``, ...) | wall time of one stage of the step | s |
| ``timing_s/step`` | wall time of the whole step (measured stages such as ``gen_autoregressive`` excluded) | s |
| ``timing_s/other`` | the step less its named stages | s |
| ``timing_s/gen_max``, ``timing_s/gen_min`` | data-parallel: the slowest and fastest rank's generation | s |
| ``timing_frac/<stage>`` | the stage's share of ``timing_s/step`` | fraction |
| ``spec/acceptance_length`` | 1 + accepted / drafts (vLLM's mean acceptance length) | tokens per draft |
| ``spec/acceptance_rate`` | accepted / drafted tokens | fraction |
| ``spec/acceptance_rate_pos_<i>`` | drafts whose position i was accepted / drafts | fraction |
| ``spec/num_drafts``, ``spec/num_draft_tokens``, ``spec/num_accepted_tokens`` | the step's vLLM-style counters | count |
| ``spec/k_mean``, ``spec/k_frac_<j>`` | adaptive speculation: mean k_t, share of forwards at k_t = j | tokens, fraction |
| ``spec/k_mean_rows_le_<b>`` | mean k_t over forwards with b/2 < live rows <= b | tokens |
| ``spec/acceptance_length_first``, ``..._last`` | a sweep point's summary: the first and last step's acceptance length | tokens per draft |
| ``reward/mean``, ``reward/std`` | the step's total reward over its rollouts | reward |
| ``reward/accuracy``, ``reward/format``, ``reward/last_number`` | the task's verifier, its format reward, the anchor-free check (last number = answer; logged, not trained on) (means; ``eval/*`` the same on held-out prompts) | fraction |
| ``reward/final`` | a sweep point's summary: the last step's ``reward/mean`` | reward |
| ``eval/accuracy`` (+ ``_ci95_low``, ``_ci95_high``) | greedy accuracy on the held-out prompts, Wilson 95 % | fraction |
| ``eval_sampled/accuracy`` (+ the same) | held-out accuracy at the rollouts' sampling settings | fraction |
| ``eval/acceptance_length``, ``eval_sampled/acceptance_length`` (+ ``acceptance_rate``, ``acceptance_rate_pos_<i>``) | the ``spec/*`` counters of the eval's generation: acceptance on held-out prompts, which no drafter init trains on | tokens per draft, fraction |
| ``gen/tokens_per_s`` | generated tokens / ``timing_s/gen`` | tokens/s |
| ``gen/num_tokens`` | tokens generated in the step | count |
| ``gen/modeled_s``, ``gen_autoregressive/modeled_s`` | counted forwards × the cached cost curve (``perf/modeled.py``) | s |
| ``gen/logprob_abs_diff``, ``gen/logprob_truncation_abs_diff`` | rollout vs trainer log-prob gap per token | nats |
| ``gen_autoregressive/num_tokens``, ``.../num_forwards``, ``.../first`` | the paired plain arm's counters | count |
| ``gen_autoregressive/differing_tokens``, ``.../differing_rows`` | completion positions (rows) where the speculative rollouts differ from the paired plain arm's: 0 under ``rollout.sampler=keyed`` up to float ties | count |
| ``speedup/gen``, ``speedup/step`` (+ ``_per_step``, ``_unpaired``) | paired speedup of generation, of the step | ratio |
| ``speedup/gen_modeled`` | modelled generation speedup (``gen_autoregressive/modeled_s`` / ``gen/modeled_s``) | ratio |
| ``async/staleness`` | policy versions between the rollout and the step that trains on it | versions |
| ``async/is_weight_mean``, ``async/is_capped_frac`` | truncated importance weights: mean, share at the cap | ratio, fraction |
| ``train/step_skipped`` | 1 when no optimiser step was taken: no learning signal (every group's rewards equal, no KL term) or a non-finite gradient | 0/1 |
| ``loss/policy`` | the GRPO loss | nats |
| ``policy/kl_from_init`` | with ``measure.drafter_drift``: k3 KL of the policy from its initial weights on the step's rollouts | nats / token |
| ``draft/loss`` (+ ``_step_<j>``), ``draft/top1_agreement`` | drafter training loss (per chain step), top-1 agreement with the target | nats, fraction |
| ``draft/heldout_loss``, ``draft/buffer_size`` | online adaptation: held-out loss, rows in the replay buffer | nats, count |
| ``completions/mean_length``, ``min_length``, ``max_length`` | completion lengths in the step | tokens |
| ``completions/clipped_ratio``, ``completions/frac_stop`` | share stopped by the length cap, by a stop token | fraction |

Artifacts: ``completions/lengths/step_<n>.json`` (``COMPLETION_LENGTHS_DIR``), every completion's length.
"""  # noqa: E501 (a Markdown table: one row a line)

# --- timing: seconds per stage (workbench.timing.StageTimer), shares of the step ---
TIMING = "timing_s/"
TIMING_FRAC = "timing_frac/"


def timing(stage: str) -> str:
    """``timing_s/<stage>``: seconds the stage took in one step."""
    return f"{TIMING}{stage}"


def timing_frac(stage: str) -> str:
    """``timing_frac/<stage>``: the stage's share of the step."""
    return f"{TIMING_FRAC}{stage}"


GEN_S = timing("gen")
STEP_S = timing("step")
OTHER_S = timing("other")
EVAL_S = timing("eval")
GEN_AR_S = timing("gen_autoregressive")
DRAFT_TRAIN_S = timing("draft_train")  # online drafter adaptation: speculation's cost, which a plain run does not pay
GEN_MAX_S = timing("gen_max")
GEN_MIN_S = timing("gen_min")
GEN_FRAC = timing_frac("gen")

# --- spec/: speculation counters (workbench.rollout.counters.SpecCounters writes these literals) ---
SPEC = "spec/"
ACCEPTANCE_LENGTH = "spec/acceptance_length"
ACCEPTANCE_RATE = "spec/acceptance_rate"
ACCEPTANCE_RATE_POS = "spec/acceptance_rate_pos_"  # + i
NUM_DRAFTS = "spec/num_drafts"
NUM_DRAFT_TOKENS = "spec/num_draft_tokens"
NUM_ACCEPTED_TOKENS = "spec/num_accepted_tokens"
K_MEAN = "spec/k_mean"
K_FRAC = "spec/k_frac_"  # + j
K_MEAN_BY_ROWS = "spec/k_mean_rows_le_"  # + b, a power of two
ACCEPTANCE_LENGTH_FIRST = "spec/acceptance_length_first"
ACCEPTANCE_LENGTH_LAST = "spec/acceptance_length_last"
DRAFTER_HEALTH = (
    "spec/drafter_health"  # 1 healthy, 0 collapsed after the step's weight sync (workbench.grpo.drafter_health)
)


def acceptance_rate_pos(i: int) -> str:
    """``spec/acceptance_rate_pos_<i>``: the share of drafts whose position ``i`` (0-based) was accepted."""
    return f"{ACCEPTANCE_RATE_POS}{i}"


def k_frac(j: int) -> str:
    """``spec/k_frac_<j>``: the share of forwards that drafted k_t = j tokens."""
    return f"{K_FRAC}{j}"


def suffix_int(key: str, prefix: str) -> int:
    """The integer after ``prefix`` in ``key`` (``suffix_int("spec/k_frac_3", K_FRAC) == 3``)."""
    return int(key[len(prefix) :])


# --- reward/, eval/, eval_sampled/: the task's rewards (workbench.grpo.rewards.Scores.metrics) ---
REWARD = "reward"  # the prefix of the training rollouts' rewards
EVAL = "eval"  # held-out, greedy
EVAL_SAMPLED = "eval_sampled"  # held-out, at the rollouts' sampling settings
REWARD_MEAN = "reward/mean"
REWARD_STD = "reward/std"
REWARD_FINAL = "reward/final"
EVAL_ACCURACY = "eval/accuracy"


def held_out_spec(prefix: str, spec_metrics: dict[str, float]) -> dict[str, float]:
    """``<prefix>/acceptance_length``, ``<prefix>/acceptance_rate(_pos_<i>)``: the acceptance entries of
    ``spec/*`` metrics (``SpecCounters.metrics``) renamed under an eval prefix (``eval``, ``eval_sampled``);
    the raw counts are left out."""
    keep = (ACCEPTANCE_LENGTH, ACCEPTANCE_RATE)  # ACCEPTANCE_RATE also prefixes the per-position rates
    return {f"{prefix}/{k[len(SPEC) :]}": v for k, v in spec_metrics.items() if k.startswith(keep)}


def reward_key(prefix: str, name: str) -> str:
    """``<prefix>/<name>``: a reward's mean (``reward/accuracy``, ``eval/format``, ``eval_sampled/accuracy``)."""
    return f"{prefix}/{name}"


# --- gen/, gen_autoregressive/, speedup/: generation throughput and the paired speedups ---
TOKENS_PER_S = "gen/tokens_per_s"
NUM_TOKENS = "gen/num_tokens"
LOGPROB_ABS_DIFF = "gen/logprob_abs_diff"
LOGPROB_TRUNCATION_ABS_DIFF = "gen/logprob_truncation_abs_diff"
GEN_MODELED_S = "gen/modeled_s"
AR_MODELED_S = "gen_autoregressive/modeled_s"
AR_NUM_TOKENS = "gen_autoregressive/num_tokens"
AR_NUM_FORWARDS = "gen_autoregressive/num_forwards"
AR_FIRST = "gen_autoregressive/first"
AR_DIFFERING_TOKENS = "gen_autoregressive/differing_tokens"
AR_DIFFERING_ROWS = "gen_autoregressive/differing_rows"
SPEEDUP_GEN = "speedup/gen"
SPEEDUP_STEP = "speedup/step"
SPEEDUP_GEN_PER_STEP = "speedup/gen_per_step"
SPEEDUP_STEP_PER_STEP = "speedup/step_per_step"
SPEEDUP_GEN_MODELED = "speedup/gen_modeled"

# --- async/, train/, loss/: the GRPO step ---
STALENESS = "async/staleness"
IS_WEIGHT_MEAN = "async/is_weight_mean"
IS_CAPPED_FRAC = "async/is_capped_frac"
STEP_SKIPPED = "train/step_skipped"
LOSS_POLICY = "loss/policy"
KL_FROM_INIT = "policy/kl_from_init"

# --- draft/: drafter training (drafters/*: their loss functions write these literals) ---
DRAFT_LOSS = "draft/loss"
DRAFT_TOP1 = "draft/top1_agreement"
DRAFT_HELDOUT_LOSS = "draft/heldout_loss"
DRAFT_BUFFER_SIZE = "draft/buffer_size"

# --- completions/: lengths of the step's completions (workbench.grpo.completions) ---
COMPLETIONS_MEAN_LENGTH = "completions/mean_length"
COMPLETIONS_MIN_LENGTH = "completions/min_length"
COMPLETIONS_MAX_LENGTH = "completions/max_length"
COMPLETIONS_CLIPPED_RATIO = "completions/clipped_ratio"
COMPLETIONS_FRAC_STOP = "completions/frac_stop"
COMPLETION_LENGTHS_DIR = "completions/lengths"  # an artifact folder, not a metric: step_<n>.json

# Histories a reader loads by default: everything the tables, plots and the performance models read.
HISTORY_PREFIXES = (
    TIMING,
    TIMING_FRAC,
    SPEC,
    "reward/",
    "eval/",
    "eval_sampled/",
    "speedup/",
    "gen/",
    "gen_autoregressive/",
    "draft/",
    "completions/",
)
