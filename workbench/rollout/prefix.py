"""Prompts already prefilled in this generation, for rows that join later (continuous batching).

A GRPO step holds G rollouts of each prompt. Decoded in one batch, a group's prompt is prefilled
once and its KV rows copied (prefix sharing). With continuous batching the G rows of a prompt may
join the batch at different steps; without this store each would pay the prompt's prefill again.
So, as vLLM's automatic prefix caching keeps a prompt's KV blocks, the engine keeps what a prefill
of a prompt produced while rows of that prompt still wait in the queue: its KV entries at the
prompt's positions, its next-token logits and the hidden states the drafter reads. A row joining
later copies them instead of running the target. Entries leave once no row of the prompt waits,
so the store holds at most the prompts of partly admitted groups.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from workbench.rollout.layers import KVCache


@dataclass
class PromptEntry:
    """One prompt of P tokens: k, v per layer (P, Hkv, D); logits (1, V) at its last position;
    hidden {layer: (P, H)} (empty unless the drafter reads the target)."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    logits: torch.Tensor
    hidden: dict[int, torch.Tensor]


class PromptStore:
    """Prefilled prompts of one generation, kept while rows of them wait.

    Args:
        waiting: the prompts (token tuples) of the rows still in the queue, with multiplicity.
    """

    def __init__(self, waiting: Counter):
        self.waiting = waiting
        self.entries: dict[tuple[int, ...], PromptEntry] = {}

    def __contains__(self, key: tuple[int, ...]) -> bool:
        return key in self.entries

    def admitted(self, keys: list[tuple[int, ...]]) -> None:
        """Rows of these prompts left the queue; a prompt no row waits for is dropped."""
        self.waiting.subtract(keys)
        for key in set(keys):
            if self.waiting[key] <= 0:
                self.entries.pop(key, None)

    def keep(
        self,
        key: tuple[int, ...],
        cache: KVCache,
        row: int,
        logits: torch.Tensor,
        hidden: dict[int, torch.Tensor],
        col: int,
    ) -> None:
        """Keep prompt ``key`` (P tokens) from ``cache`` row ``row``, ``logits`` (1, V) and ``hidden``
        {layer: (P', H)} row ``col``, if rows of it still wait."""
        if self.waiting[key] <= 0 or key in self.entries:
            return
        P = len(key)
        self.entries[key] = PromptEntry(
            [t[row, :P].clone() for t in cache.k],
            [t[row, :P].clone() for t in cache.v],
            logits.clone(),
            {i: h[col, :P].clone() for i, h in hidden.items()},
        )

    def write(self, key: tuple[int, ...], cache: KVCache, row: int) -> PromptEntry:
        """Copy prompt ``key``'s KV entries into ``cache`` row ``row`` (positions 0..P-1); the entry."""
        e = self.entries[key]
        P = len(key)
        for dst, src in ((cache.k, e.k), (cache.v, e.v)):
            for t, s in zip(dst, src):
                t[row, :P] = s
        return e
