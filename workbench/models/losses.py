"""Training losses of the model builds and of draft-model distillation (units: nats per token).

Both average over masked positions only: the completion positions, where a model is scored and
where a drafter proposes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def completion_ce(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a causal LM over masked positions. ids [B, T], mask [B, T-1] -> scalar."""
    logits = model(input_ids=ids[:, :-1]).logits  # [B, T-1, V]
    ce = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    return (ce * mask.flatten()).sum() / mask.sum()


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean KL(teacher || student) at temperature 1 over masked positions (computed in float32).

    logits [B, T, V], mask [B, T] -> scalar (nats per token). Forward KL is mass-covering: the
    student is pushed to put probability wherever the teacher does, which is what acceptance
    sum_x min(p, q) rewards (Leviathan et al. 2023; DistillSpec, Zhou et al. 2024).
    """
    t_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    s_logp = F.log_softmax(student_logits.float(), dim=-1)
    kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1)  # [B, T]
    return (kl * mask).sum() / mask.sum()
