"""``ngram`` drafter: prompt lookup decoding (Saxena 2023; vLLM ``method="ngram"``).

For each row, find the longest suffix of prompt + generated tokens, of length in
[prompt_lookup_min, prompt_lookup_max], that occurred earlier in the same row, and propose the (up
to k) tokens that followed its most recent earlier occurrence — vLLM v1's NgramProposer
semantics. No match -> no drafts for that row (it decodes one token that step). Drafts are
deterministic, so verification uses q = one-hot(draft).
"""

from __future__ import annotations

import numpy as np
import torch

from drafters.base import DraftContext, Drafter, DraftProposal, register


def ngram_propose(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> np.ndarray:
    """Draft tokens (<= k) for one sequence ``tokens`` (T,) int; empty if no suffix match.

    The longest matching n wins; among equal n the most recent earlier occurrence wins.
    """
    T = len(tokens)
    for n in range(min(max_n, T - 1), min_n - 1, -1):
        suffix = tokens[T - n :]
        # windows[i] = tokens[i:i+n] for i in 0..T-n-1 (excludes the suffix itself)
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: T - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return tokens[start : start + k]
    return tokens[:0]


@register
class NgramDrafter(Drafter):
    kind = "ngram"

    def __init__(self, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4):
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    @classmethod
    def from_spec(cls, spec, target=None, device=None) -> "NgramDrafter":
        return cls(spec.prompt_lookup_min, spec.prompt_lookup_max)

    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        B = ctx.lens.shape[0]
        toks = ctx.tokens.cpu().numpy()
        lens = ctx.lens.tolist()
        drafts = np.zeros((B, k), dtype=np.int64)
        num = np.zeros(B, dtype=np.int64)
        for b in range(B):
            d = ngram_propose(toks[b, : lens[b]], self.min_n, self.max_n, k)
            drafts[b, : len(d)] = d
            num[b] = len(d)
        dev = ctx.tokens.device
        return DraftProposal(torch.from_numpy(drafts).to(dev), torch.from_numpy(num).to(dev), None)
