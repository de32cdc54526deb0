"""A step's rollouts as the trainer's tensors: prompt + completion packed and right-padded, and the
policy's per-token log-probs over them in micro-batches (docs/design.md §3, the logprob stage)."""

from __future__ import annotations

import torch

from workbench.grpo.loss import token_logprobs
from workbench.rollout.engine import RolloutOutput


def pack_rollouts(
    prompts: list[list[int]], out: RolloutOutput, pad_id: int, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenate prompt + completion per row and right-pad.

    Returns input_ids (N, L), completion mask (N, L-1) and rollout logp (N, L-1), aligned with the
    next-token targets ``input_ids[:, 1:]`` (right padding keeps causal logits exact).
    """
    seqs = [p + c for p, c in zip(prompts, out.tokens)]
    L = max(map(len, seqs))
    N = len(seqs)
    ids = torch.full((N, L), pad_id, dtype=torch.long)
    mask = torch.zeros(N, L - 1)
    logp = torch.zeros(N, L - 1)
    for i, (p, c, lp) in enumerate(zip(prompts, out.tokens, out.logprobs)):
        ids[i, : len(p) + len(c)] = torch.tensor(p + c)
        mask[i, len(p) - 1 : len(p) - 1 + len(c)] = 1.0
        logp[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(lp)
    return ids.to(device), mask.to(device), logp.to(device)


def sequence_logprobs(
    model, input_ids: torch.Tensor, temperature: float, micro_batch: int, keep_logits: list | None = None
) -> torch.Tensor:
    """log pi(token_t | <t) for input_ids[:, 1:] (N, L-1), in micro-batches. Grad follows caller's mode.

    ``keep_logits``: if a list, each micro-batch's full logits (n, L, V) are appended to it, detached
    (what online drafter adaptation learns from).
    """
    parts = []
    for i in range(0, input_ids.shape[0], micro_batch):
        ids = input_ids[i : i + micro_batch]
        full = model(ids).logits  # (n, L, V)
        if keep_logits is not None:
            keep_logits.append(full.detach().float())
        parts.append(token_logprobs(full[:, :-1], ids[:, 1:], temperature))
    return torch.cat(parts)
