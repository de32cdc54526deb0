"""`wb audit`: a statistical check that speculative rollouts follow the target's distribution.

For each drafter, the audit samples ``n`` completions of each audit prompt through the speculative
rollout engine (short ``max_new_tokens``; by default k+2, which covers the prefill token and a
whole verification step including its bonus token) and tests them against the target's *exact*
law, computed by teacher-forcing the sampled rows through the target (docs/design.md §4):

(a) per position t: the observed histogram of the token at t (over rows still running) against
    the expected counts E_t(v) = sum over rows of p(v | that row's prefix), the target's processed
    distribution (temperature/top-k/top-p) given exactly the prefix the row sampled; a Pearson
    chi-square goodness-of-fit test. Under exactness each token is an independent draw from its
    row's conditional, so O_t - E_t is a sum of independent centred indicators; with rows that
    share a prefix (position 0, all rows) the test is the classical multinomial one, and with
    heterogeneous conditionals the statistic is stochastically smaller than chi-square(C-1), so
    the stated false-alarm rate still holds (conservative);
(b) whole short sequences: the first two tokens as one joint category against the enumerated exact
    joint law p(x0) p(x1 | x0) (rows that stop at x0 excluded: eos and every other stop id, e.g. a
    chat template's end-of-turn, end a row in the engines and so here; at a real vocabulary the first
    tokens too rare to fill a cell are pooled per first token, :mod:`workbench.audit.joint`);
(c) greedy: temperature-0 speculative decoding must equal greedy autoregressive decoding token for
    token (deterministic, so it cannot false-alarm and is not part of the error budget).

Pooling: cells with expected count < ``min_expected`` (5) are merged into one "other" cell (merged
into the smallest kept cell if still small). A sampled token the target gives probability 0 fails
at once (p = 0).

False alarms: the m = drafters x prompts x (positions + 1) tests are Bonferroni-corrected, each run
at alpha/m, so the probability that an exact engine fails the audit is at most ``alpha`` (default
1e-3).

Power (sample size). A shift of delta in one token's probability is a 1-df contrast against the
known expectation; a two-sided one-sample z-test at level a = alpha/m with power 1 - beta needs
n = (z_{1-a/2} + z_{1-beta})^2 p (1 - p) / delta^2 rows, largest at p = 0.5. E.g. 4 drafters, 1
prompt, 5 positions: m = 24, a = 4.2e-5, z = 4.10 + 1.28, n = 72k rows per drafter and prompt for
delta = 1 %. Comparing against the exact law instead of a second (autoregressive) sample halves the
rows needed and removes the autoregressive arm. :func:`required_samples` computes n and the CLI
prints it with :func:`detectable_shift` (the delta detectable at the n used). The omnibus
chi-square spends its power on C-1 df, so for a shift confined to one token its detectable delta
is somewhat larger than the 1-df value.

Budget: identical prompts are prefilled once (the engine's prefix sharing), so the cost is the
decode steps and one teacher-forced pass over the sampled tokens.

Contexts: a trained target is often certain for the first completion tokens (arith_chain restates
the expression), where every test would be vacuous (one category, p = 1). :func:`informative_prompts`
therefore extends each task prompt with the target's own sampled completion up to one token before
the first position where the target is uncertain (most frequent token < 95 % in a small
autoregressive pilot), so the tested positions carry entropy where speculation acts: the first
completion token comes from the prefill and is never drafted, so the uncertain token sits at
completion position 1, the first draft verified. (Before, it sat at position 0: on the quickstart
the drafted positions were then near-certain, acceptance 1.00 for draft_model and eagle3 in vLLM.)
Where a drafter rarely drafts the target's token there (ngram on a real model), :func:`accepting_contexts`
finds, per drafter, a context whose first draft is accepted at a rate in a band (``wb audit --context
accepted``; :mod:`workbench.audit.contexts`).

Engine paths: by default each drafter runs in a bare engine (k every step, rows retired at once);
:class:`~workbench.audit.engines.EngineOptions` (``wb audit --adaptive --buckets --compile``) turns
on adaptive k, retire buckets and ``torch.compile``, so the audit reaches the paths runs take.

A sampler can be injected (``rejection_fn``) to check that the audit catches a biased engine, e.g.
:func:`accept_all_rejection_sample`, which accepts every draft.
"""

from workbench.audit.contexts import ACCEPT_BAND, accepting_contexts, first_position_acceptance, informative_prompts
from workbench.audit.engines import EngineOptions
from workbench.audit.joint import Joint2, exact_joint2
from workbench.audit.law import (
    END,
    AuditResult,
    AuditTest,
    accept_all_rejection_sample,
    detectable_shift,
    expected_counts,
    goodness_of_fit,
    plan,
    position_counts,
    required_samples,
    run_audit,
    summary_rows,
)

__all__ = [
    "ACCEPT_BAND",
    "END",
    "AuditResult",
    "Joint2",
    "EngineOptions",
    "AuditTest",
    "accept_all_rejection_sample",
    "accepting_contexts",
    "detectable_shift",
    "exact_joint2",
    "first_position_acceptance",
    "expected_counts",
    "goodness_of_fit",
    "informative_prompts",
    "plan",
    "position_counts",
    "required_samples",
    "run_audit",
    "summary_rows",
]
