"""The learning-rate schedule of every from-scratch training here: linear warmup, then cosine decay
to 10 % of the peak lr, from transformers (``get_cosine_with_min_lr_schedule_with_warmup``).

Used by the preset builds (:mod:`workbench.models.pretrain`, :mod:`workbench.models.distill`) and
by drafter initialisation (:mod:`drafters.training`). transformers' shape, per optimiser step s
(0-based, the scheduler stepped after each optimiser step): lr·s/warmup while s < warmup (so the
first step runs at lr 0), then lr·(0.1 + 0.9·½(1 + cos(π·(s − warmup)/(total − warmup)))),
reaching 0.1·lr at s = total.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup  # top-level only in newer releases

MIN_LR_RATE = 0.1  # final lr as a fraction of the peak lr


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """transformers' warmup + cosine schedule to MIN_LR_RATE·lr over ``total_steps`` optimiser steps.

    Call ``.step()`` after each ``optimizer.step()``. The peak lr is the optimizer's own lr.
    """
    return get_cosine_with_min_lr_schedule_with_warmup(
        optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps, min_lr_rate=MIN_LR_RATE
    )


def adamw(params, lr: float, weight_decay: float = 0.0) -> torch.optim.AdamW:
    """AdamW with betas (0.9, 0.95), the usual choice for small LM pretraining (nanoGPT, Llama)."""
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)


def optimizer_step(
    model: torch.nn.Module, opt: torch.optim.Optimizer, sched: LambdaLR, loss: torch.Tensor, max_grad_norm: float = 1.0
) -> None:
    """One step of a build recipe: backward of ``loss``, gradient-norm clipping at ``max_grad_norm``,
    the optimiser step, then the schedule's step (the learning rate of the next step)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    opt.step()
    sched.step()
