"""GRPO's optimiser step, or the reasons not to take one (no learning signal, a non-finite gradient)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch


def optimiser_step(
    has_signal: bool, optimizer, train_engine, params: Iterable[torch.nn.Parameter], max_grad_norm: float
) -> tuple[float, float]:
    """The step after the batch's backward passes: (grad_norm, ``train/step_skipped``); ``optimizer``
    steps ``params`` clipped to ``max_grad_norm``, or ``train_engine`` (DeepSpeed) has stepped already.

    No optimiser step is taken, and 1.0 is returned as skipped, when the batch has no learning
    signal (every group's rewards equal and no KL term: the gradient is exactly 0, yet AdamW would
    still move every weight by its momentum, lr * m_hat / sqrt(v_hat), O(lr) for ~10-20 steps after
    the last signal; with sparse rewards such batches come in runs and that drift, measured to
    flatten the policy, made the quickstart unlearn; DAPO's dynamic sampling never steps on such
    groups either), or when the gradient is not finite (an inf norm would make clipping multiply
    by 0 and inf by 0 is NaN). Under DeepSpeed (ZeRO >= 1) the engine itself declines a
    non-finite step (its overflow check, every rank agreeing) and ``was_step_applied`` says so.
    """
    if not has_signal:
        return 0.0, 1.0
    if train_engine is not None:  # stepped at the last micro-batch, clipped at gradient_clipping
        norm = train_engine.get_global_grad_norm()
        return float(norm if norm is not None else 0.0), 0.0 if train_engine.was_step_applied() else 1.0
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
    # NaN fails both comparisons; MasterAdamW also declines non-finite half-precision gradients
    if math.isfinite(grad_norm) and grad_norm > 0.0 and optimizer.step() is not False:
        return grad_norm, 0.0
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, 1.0
