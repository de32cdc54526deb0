"""``ngram`` drafter: prompt lookup decoding (Saxena 2023; vLLM ``method="ngram"``).

For each row, find the longest suffix of prompt + generated tokens, of length in
[prompt_lookup_min, prompt_lookup_max], that occurred earlier in the same row, and propose the (up
to k) tokens that followed its earliest occurrence — vLLM v1's NgramProposer semantics
(``_find_longest_matched_ngram_and_propose_tokens``: the longest n wins, then the earliest position;
a test compares the two where vLLM is installed, so both engines draft the same tokens).
Before 2026-11-26 the most recent occurrence won here: ngram results recorded before then drafted
differently from vLLM where a suffix occurred more than once. No match -> no drafts for that row (it decodes one token
that step). Drafts are deterministic, so verification uses q = one-hot(draft). Stateless: every ``propose`` searches
the tokens of its fresh context; ``start``/``accept`` do nothing.
"""

from __future__ import annotations

import numpy as np
import torch

from drafters.registry import register
from workbench.rollout.drafter import DraftContext, Drafter, DrafterTarget, DraftProposal


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """Draft tokens (<= k) for one sequence ``tokens`` (T,) int; empty if no suffix match.

    The longest matching n wins; among equal n the earliest occurrence wins (vLLM's rule).
    """
    T = len(tokens)
    for n in range(min(max_n, T - 1), min_n - 1, -1):
        suffix = tokens[T - n :]
        # windows[i] = tokens[i:i+n] for i in 0..T-n-1 (excludes the suffix itself)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: T - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[0]) + n
            return tokens[start : start + k]
    return tokens[:0]


def ngram_propose_batch(
    tokens: torch.Tensor, lens: torch.Tensor, min_n: int, max_n: int, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`ngram_propose` for every row at once: tokens (B, T_max) long valid up to lens (B,).

    Returns drafts (B, k) long (zero-padded) and their counts (B,) long. Same semantics, row by
    row (a test checks it against the one-row reference), as tensor ops: one (B, W, n) window
    comparison per n instead of a Python loop over rows.
    """
    B, T_max = tokens.shape
    dev = tokens.device
    drafts = torch.zeros(B, k, dtype=torch.long, device=dev)
    num = torch.zeros(B, dtype=torch.long, device=dev)
    found = torch.zeros(B, dtype=torch.bool, device=dev)
    for n in range(min(max_n, T_max - 1), min_n - 1, -1):
        suffix = tokens.gather(1, (lens - n).clamp_min(0)[:, None] + torch.arange(n, device=dev))  # (B, n)
        windows = tokens.unfold(1, n, 1)  # (B, W, n): windows[b, i] = tokens[b, i:i+n], W = T_max-n+1
        i = torch.arange(windows.shape[1], device=dev)
        # earlier occurrences only: the window lies inside tokens[:len-1] (i + n <= len - 1)
        hit = (windows == suffix[:, None, :]).all(-1) & (i[None, :] <= (lens - 1 - n)[:, None])  # (B, W)
        first = torch.where(hit, i[None, :], T_max).amin(1)  # (B,) earliest occurrence, T_max if none
        new = (first < T_max) & ~found & (lens - 1 >= n)
        start = first + n  # (B,) first token after the occurrence
        cnt = (lens - start).clamp(0, k)
        cols = (start[:, None] + torch.arange(k, device=dev)).clamp_max(T_max - 1)  # (B, k)
        take = new[:, None] & (torch.arange(k, device=dev)[None, :] < cnt[:, None])
        drafts = torch.where(take, tokens.gather(1, cols), drafts)
        num = torch.where(new, cnt, num)
        found |= new
    return drafts, num


@register
class NgramDrafter(Drafter):
    kind = "ngram"

    @classmethod
    def vllm_speculative_config(cls, spec, draft_folder, draft_sample_method=None, require_installed=True) -> dict:
        """vLLM's prompt-lookup method: the same n-gram window (``prompt_lookup_min/max``)."""
        return {
            "method": "ngram",
            "num_speculative_tokens": spec.k,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "prompt_lookup_max": spec.prompt_lookup_max,
        }

    def __init__(self, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    @classmethod
    def from_spec(cls, spec, target: DrafterTarget | None = None, device=None) -> "NgramDrafter":
        return cls(spec.prompt_lookup_min, spec.prompt_lookup_max)

    def admit(self, ctx: DraftContext, hidden: dict[int, torch.Tensor], n_old: int) -> None:
        """Nothing kept per row: proposals read the batch's tokens."""

    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        """Drafts (B, k) long (zero-padded), num_draft (B,) long, probs None (one-hot q)."""
        drafts, num = ngram_propose_batch(ctx.tokens, ctx.lens, self.min_n, self.max_n, k)
        return DraftProposal(drafts, num, None)
