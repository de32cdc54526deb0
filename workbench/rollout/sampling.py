"""The sampling transform: logits -> the processed distribution p that rollouts sample from.

docs/design.md §4: temperature, top-k and top-p are applied to the target's logits *before*
verification, and the same transform is applied to drafter logits to get q. Speculative sampling
then preserves p exactly. Order follows vLLM: temperature, then top-k, then top-p.
Temperature 0 (greedy) gives the one-hot distribution of the argmax, which makes greedy decoding a
special case of the rejection sampler (accept iff the draft equals the argmax).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How rollouts are sampled; ``temperature == 0`` means greedy. Units: tokens."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    eos_token_id: int | None = None
    # More ids that end a completion besides eos (a chat template's end-of-turn token, a generation
    # config's eos list: workbench.models.chat.PromptFormat.stop_token_ids); vLLM's stop_token_ids
    stop_token_ids: tuple[int, ...] = ()
    # "rejection": modified rejection sampling from the call's generator (Leviathan et al. 2023); "keyed":
    # drafter-invariant sampling (workbench.rollout.keyed; Daliri et al. 2024): the token at completion
    # position t is the Gumbel-max sample of p_t under noise keyed by (row seed, t), so speculative
    # output equals plain output with the same seeds (model drafters draft as keyed_draft says)
    sampler: str = "rejection"
    # keyed: one seed per prompt of the call (vLLM's per-request seed); None = drawn from the call's generator
    seeds: tuple[int, ...] | None = None
    # keyed: how model drafters draft: "coupled" = Gumbel-max under the target's keyed noise (Daliri et al.'s
    # coupled draft; accepted about as often as a sampled draft under rejection sampling, measured on tiny and
    # micro), "argmax" = the likeliest draft token (vLLM's proposers; more on low-entropy targets, about never
    # on high-entropy ones: micro's draft model 0.02 against 0.89)
    keyed_draft: str = "coupled"

    def __post_init__(self):
        if self.sampler not in ("rejection", "keyed"):
            raise ValueError(f"rollout.sampler: {self.sampler!r} is not one of 'rejection', 'keyed'")
        if self.keyed_draft not in ("coupled", "argmax"):
            raise ValueError(f"rollout.keyed_draft: {self.keyed_draft!r} is not one of 'coupled', 'argmax'")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def keyed(self) -> bool:
        """Drafter-invariant sampling (``sampler == "keyed"``)."""
        return self.sampler == "keyed"

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Every id that ends a completion (eos first if set), distinct."""
        ids = () if self.eos_token_id is None else (self.eos_token_id,)
        return ids + tuple(i for i in dict.fromkeys(self.stop_token_ids) if i not in ids)


def is_stop(tokens: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Bool tensor of ``tokens``' shape: True where a token ends a completion (eos or a stop id)."""
    ids = sp.stop_ids
    if len(ids) <= 1:
        return tokens == (ids[0] if ids else -1)
    return torch.isin(tokens, torch.tensor(ids, device=tokens.device))


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """Processed distribution p (..., V) float32 from raw logits (..., V).

    Greedy -> one-hot(argmax). Top-k keeps the k largest logits; top-p keeps the smallest set of
    most likely tokens whose mass reaches ``top_p`` (the token that crosses the threshold is kept).
    """
    logits = logits.float()
    if sp.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / sp.temperature
    V = logits.shape[-1]
    if 0 < sp.top_k < V:
        kth = torch.topk(logits, sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sp.top_p < 1.0:
        sorted_logits, idx = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # Drop a token when the mass strictly before it already reaches top_p.
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= sp.top_p
        drop = torch.zeros_like(drop_sorted).scatter_(-1, idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from probs (N, V) (rows need not be normalised) -> (N,) long.

    Inverse-CDF sampling: the first index whose cumulative mass exceeds u * total, u ~ U[0, 1).
    Exact (zero-probability tokens can never be chosen) and ~15x faster than torch.multinomial
    on CPU; the cumulative sum is float64 so large vocabularies keep their tail mass.
    """
    cdf = probs.double().cumsum(-1)  # (N, V)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=torch.float64) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)
