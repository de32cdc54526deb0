"""Acceptance counters of a rollout batch, in vLLM's spec-decode metric vocabulary."""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench import metrics as M


@dataclass
class SpecCounters:
    """Acceptance counters in vLLM's vocabulary, summed over a rollout batch (host ints).

    The engine fills them from its one packed device->host read per step, so counting costs no
    extra synchronisation.
    """

    k: int = 0
    num_drafts: int = 0  # verification steps of a row that had >= 1 draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_verify_steps: int = 0  # batched target forwards after prefill
    num_generated_tokens: int = 0
    # rows in each batched target forward after prefill (tokens in flight = rows * (k_t+1)): what a
    # cost curve turns into a noise-free time estimate (workbench.perf.modeled, speedup/gen_modeled)
    rows_per_forward: list[int] = field(default_factory=list)
    # k_t of each batched forward after prefill (num_speculative_tokens of that step; 0 = a plain
    # decode step): k unless a KPolicy chooses (workbench.rollout.kpolicy)
    k_per_step: list[int] = field(default_factory=list)
    # draft tokens verified in each batched forward after prefill (0 = no row drafted: an ngram or
    # suffix step without a match): which steps vLLM would run as plain ones (workbench.vllm.measure.transfer)
    draft_tokens_per_step: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.num_accepted_tokens_per_pos:
            self.num_accepted_tokens_per_pos = [0] * self.k

    def add_step(
        self, rows: int, k_t: int, num_drafts: int, num_draft_tokens: int, accepted_per_pos: list[int]
    ) -> None:
        """Count one batched forward of ``rows`` rows at k_t (host ints; ``accepted_per_pos`` (k_t,))."""
        self.num_verify_steps += 1
        self.rows_per_forward.append(rows)
        self.k_per_step.append(k_t)
        self.draft_tokens_per_step.append(num_draft_tokens)
        self.num_drafts += num_drafts
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += sum(accepted_per_pos)
        for i, c in enumerate(accepted_per_pos):
            self.num_accepted_tokens_per_pos[i] += c

    def merge(self, other: "SpecCounters") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        self.num_verify_steps += other.num_verify_steps
        self.num_generated_tokens += other.num_generated_tokens
        self.rows_per_forward += other.rows_per_forward
        self.k_per_step += other.k_per_step
        self.draft_tokens_per_step += other.draft_tokens_per_step
        for i, n in enumerate(other.num_accepted_tokens_per_pos):
            self.num_accepted_tokens_per_pos[i] += n

    def k_metrics(self) -> dict[str, float]:
        """The k_t chosen per step (adaptive speculation): ``spec/k_mean`` and ``spec/k_frac_<j>``, the
        share of steps at each j in 0..k (its histogram)."""
        n = len(self.k_per_step)
        if n == 0:
            return {}
        out = {M.K_MEAN: sum(self.k_per_step) / n}
        for j in range(self.k + 1):
            out[M.k_frac(j)] = self.k_per_step.count(j) / n
        # mean k_t by live batch size, in power-of-two bins (rows in (b/2, b]): k against batch size
        bins: dict[int, list[int]] = {}
        for rows, k_t in zip(self.rows_per_forward, self.k_per_step):
            bins.setdefault(1 << max(rows - 1, 0).bit_length(), []).append(k_t)
        for b, ks in bins.items():
            out[f"{M.K_MEAN_BY_ROWS}{b}"] = sum(ks) / len(ks)
        return out

    def metrics(self) -> dict[str, float]:
        """``spec/*`` metrics: acceptance length = 1 + accepted / drafts (vLLM's mean acceptance length)."""
        if self.k == 0 or self.num_drafts == 0:
            return {M.NUM_DRAFTS: float(self.num_drafts)} if self.k else {}
        out = {
            M.ACCEPTANCE_LENGTH: 1.0 + self.num_accepted_tokens / self.num_drafts,
            M.ACCEPTANCE_RATE: self.num_accepted_tokens / max(self.num_draft_tokens, 1),
            M.NUM_DRAFTS: float(self.num_drafts),
            M.NUM_DRAFT_TOKENS: float(self.num_draft_tokens),
            M.NUM_ACCEPTED_TOKENS: float(self.num_accepted_tokens),
        }
        for i, n in enumerate(self.num_accepted_tokens_per_pos):
            out[M.acceptance_rate_pos(i)] = n / self.num_drafts
        return out
