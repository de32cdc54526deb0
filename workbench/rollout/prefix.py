"""Prefix sharing: a batch's identical prompts prefilled once (:func:`prefill_shared`), and prompts
already prefilled in this generation kept for rows that join later (continuous batching).

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
from typing import TYPE_CHECKING

import torch

from workbench.rollout.kv_cache import KVCache

if TYPE_CHECKING:  # the model imports nothing of this module; the annotation only
    from workbench.rollout.model import LeanLM


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


def prefill_shared(
    target: LeanLM,
    prompts,
    tokens: torch.Tensor,
    prompt_lens: torch.Tensor,
    t_max: int,
    layers,
    capacity: int,
    store: PromptStore | None = None,
):
    """Prefill (B, P) right-padded prompts with ``target`` into a new (B, t_max) KV cache of ``capacity`` rows.

    Distinct prompts only (prefix sharing): U rows are computed once (or copied from ``store``,
    prompts prefilled earlier in this generation) and their cache rows copied to all B rows.
    Returns next-token logits (B, 1, V), hidden states {layer: (U, P, H)} of the distinct
    prompts, the cache, ``prompt_rows`` (U,) (a row holding each distinct prompt) and
    ``prompt_index`` (B,) (each row's distinct prompt).
    """
    B, P, dev = tokens.shape[0], tokens.shape[1], tokens.device
    first: dict[tuple[int, ...], int] = {}  # prompt -> its first row
    for b, p in enumerate(prompts):
        first.setdefault(tuple(p), b)
    keys, U = list(first), len(first)
    order = {row: u for u, row in enumerate(first.values())}
    uniq = torch.tensor(list(first.values()), device=dev)  # (U,)
    inv = torch.tensor([order[first[tuple(p)]] for p in prompts], device=dev)  # (B,)
    miss = [u for u in range(U) if store is None or keys[u] not in store]  # distinct prompts to compute
    cache = target.new_cache(U, t_max, capacity=max(B, capacity))
    zeros = torch.zeros(len(miss), dtype=torch.long, device=dev)
    if len(miss) == U:  # nothing stored: the distinct prompts straight into the cache
        logits, hidden = target(
            tokens[uniq], zeros, cache, hidden_layers=layers, logits_col=prompt_lens[uniq] - 1, max_start=0
        )
        fresh, fresh_row = cache, list(range(U))
    else:
        fresh = target.new_cache(len(miss), t_max) if miss else None
        out_l, out_h = (
            target(
                tokens[uniq[miss]],
                zeros,
                fresh,
                hidden_layers=layers,
                logits_col=prompt_lens[uniq[miss]] - 1,
                max_start=0,
            )
            if miss
            else (None, {})
        )
        fresh_row = {u: j for j, u in enumerate(miss)}
        rows_l, rows_h = [], {i: [] for i in layers}  # per distinct prompt: (1, V) logits, (P, H) hidden
        for u, key in enumerate(keys):
            if u in fresh_row:
                j = fresh_row[u]
                for dst, src in ((cache.k, fresh.k), (cache.v, fresh.v)):
                    for t, s in zip(dst, src):
                        t[u] = s[j]
                rows_l.append(out_l[j])
                for i in layers:
                    rows_h[i].append(out_h[i][j])
            else:
                e = store.write(key, cache, u)
                rows_l.append(e.logits)
                for i in layers:  # right-padded to P (padding is never read)
                    rows_h[i].append(torch.nn.functional.pad(e.hidden[i], (0, 0, 0, P - len(key))))
        logits = torch.stack(rows_l)  # (U, 1, V)
        hidden = {i: torch.stack(h) for i, h in rows_h.items()}  # (U, P, H)
    if store is not None:
        for u in miss:
            store.keep(keys[u], fresh, fresh_row[u], logits[u], hidden, u)
    if U < B:
        cache.select(inv)  # (U, ...) -> (B, ...)
        logits = logits[inv]
    return logits, hidden, cache, uniq, inv
