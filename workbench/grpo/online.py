"""Online drafter adaptation (``drafter.online``): the drafter keeps learning from the GRPO rollouts.

docs/design.md §5: the draft_train stage trains the drafter on the step's captured rollouts (the target's
hidden states and logits, detached), from a FIFO buffer, with its own optimiser; the policy's
gradients and weights are never touched (tests/test_drafter_init_online.py).
"""

from __future__ import annotations

import torch

from drafters.targets import DraftBatch
from drafters.training import DraftBuffer, DraftOptimizer, evaluate
from workbench import metrics as M
from workbench.specs.drafter import DrafterOnlineSpec


class OnlineAdaptation:
    """Online drafter adaptation (``drafter.online``): a FIFO buffer of captured rollouts and a
    persistent drafter optimiser. Each update first measures the drafter on the step's fresh
    rollouts (held out: not yet trained on), then adds them to the buffer and trains on it.

    Raises:
        ValueError: the drafter kind has no weights to adapt (names drafter.online.enabled).
    """

    def __init__(self, drafter, online: DrafterOnlineSpec, seed: int, reduce_grads=None):
        if not drafter.trainable:
            raise ValueError(
                f"drafter.online.enabled: drafter kind {drafter.kind!r} cannot be adapted; "
                "use drafter.kind=draft_model|mtp|eagle3 or drafter.online.enabled=false"
            )
        self.drafter, self.online = drafter, online
        self.buffer = DraftBuffer(online.buffer_size)
        # reduce_grads: data-parallel ranks average the drafter's gradients, so drafters stay identical
        self.opt = DraftOptimizer(drafter, online.lr, reduce_grads=reduce_grads)
        self.generator = torch.Generator().manual_seed(seed)

    def update(self, step: int, batch: DraftBatch) -> dict[str, float]:
        """``draft/top1_agreement``/``draft/heldout_loss`` on ``batch`` before training on it, then
        ``online.steps`` optimiser steps on the buffer (every ``online.every`` GRPO steps): ``draft/loss``."""
        out: dict[str, float] = {}
        due = step % self.online.every == 0
        if due:
            ev = evaluate(self.drafter, batch)
            out = {M.DRAFT_TOP1: ev[M.DRAFT_TOP1], M.DRAFT_HELDOUT_LOSS: ev[M.DRAFT_LOSS]}
        self.buffer.add(batch)
        if due:
            losses = [
                self.opt.step(self.buffer.sample(self.online.batch_size, self.generator))[M.DRAFT_LOSS]
                for _ in range(self.online.steps)
            ]
            out[M.DRAFT_LOSS] = sum(losses) / len(losses)
            out[M.DRAFT_BUFFER_SIZE] = float(len(self.buffer))
        return out
