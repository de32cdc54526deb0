"""Drafter training shared by initialisation (``wb drafter init``) and online adaptation (the
``draft_train`` stage): target states for sequences, a bounded buffer, and the optimiser step.

Everything the drafter learns from is *detached* target output (logits and hidden states computed
under ``no_grad``), so a drafter update can never reach the policy's gradients.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch

from drafters.targets import DraftBatch, TopKLogits, compact, pad_rows  # noqa: F401 (TopKLogits: docs/drafters.md names it here)
from workbench.models.schedule import warmup_cosine
from workbench.rollout.drafter import Drafter


@torch.no_grad()
def lean_target_states(lm, input_ids: torch.Tensor, loss_mask: torch.Tensor, layers: tuple[int, ...]) -> DraftBatch:
    """Teacher-forced target forward (a :class:`~workbench.rollout.model.LeanLM`) over right-padded
    ``input_ids`` (N, L): logits (N, L, V) and hidden states {layer: (N, L, H)} as a DraftBatch."""
    N, L = input_ids.shape
    cache = lm.new_cache(N, L)
    logits, hidden = lm(
        input_ids, torch.zeros(N, dtype=torch.long, device=input_ids.device), cache, hidden_layers=layers
    )
    return DraftBatch(input_ids, loss_mask, logits.float(), hidden)


class capture_hidden:
    """Context manager: record the inputs of the given layers of a transformers Llama model
    (layer ``num_layers`` = the final norm's input, i.e. the last layer's output), the same
    convention as :meth:`LeanLM.forward`. ``.hidden`` maps layer -> list of (n, L, H), one per forward.
    """

    def __init__(self, hf_model, layers: tuple[int, ...]):
        self.model, self.layers = hf_model, tuple(layers)
        self.hidden: dict[int, list[torch.Tensor]] = {i: [] for i in self.layers}
        self._handles: list = []

    def __enter__(self) -> "capture_hidden":
        body = self.model.model
        n = len(body.layers)
        for i in self.layers:
            mod = body.norm if i == n else body.layers[i]
            self._handles.append(mod.register_forward_pre_hook(self._hook(i), with_kwargs=True))
        return self

    def _hook(self, i: int):
        def fn(module, args, kwargs):
            x = args[0] if args else kwargs["hidden_states"]
            self.hidden[i].append(x.detach())

        return fn

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()


def completion_loss_mask(prompt_lens: list[int], lens: list[int], L: int) -> torch.Tensor:
    """(N, L) float: 1 at positions p in [prompt_len-1, len-1) (the next token is a completion token)."""
    m = torch.zeros(len(lens), L)
    for i, (p, n) in enumerate(zip(prompt_lens, lens)):
        m[i, p - 1 : n - 1] = 1.0
    return m


class DraftBuffer:
    """FIFO of per-sequence target states (on CPU memory of the device), at most ``size`` sequences.
    Rows of a vocabulary above ``drafters.targets.TOPK_MIN_VOCAB`` keep their target logits as
    :class:`~drafters.targets.TopKLogits`."""

    def __init__(self, size: int):
        self.rows: deque = deque(maxlen=size)

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, batch: DraftBatch) -> None:
        L = batch.input_ids.shape[1]
        for i in range(batch.input_ids.shape[0]):
            # keep up to one position past the last masked one (its token is the last label)
            n = min(L, int(batch.loss_mask[i].nonzero().max()) + 2) if batch.loss_mask[i].any() else L
            self.rows.append(
                DraftBatch(
                    batch.input_ids[i, :n],
                    batch.loss_mask[i, :n],
                    compact(batch.target_logits[i, :n]),
                    {k: h[i, :n] for k, h in batch.hidden.items()},
                )
            )

    def sample(self, n: int, generator: torch.Generator | None = None) -> DraftBatch:
        idx = torch.randperm(len(self.rows), generator=generator)[:n].tolist()
        return collate([self.rows[i] for i in idx])


def collate(rows: list[DraftBatch]) -> DraftBatch:
    """Right-pad per-sequence DraftBatches (each (L_i,), (L_i, V) or TopKLogits (L_i, K), ...)
    into one (N, L_max) batch (target logits (N, L_max, V) or TopKLogits (N, L_max, K))."""
    L = max(r.input_ids.shape[0] for r in rows)

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, [0, 0] * (t.dim() - 1) + [0, L - t.shape[0]])

    return DraftBatch(
        torch.stack([pad(r.input_ids) for r in rows]),
        torch.stack([pad(r.loss_mask) for r in rows]),
        pad_rows([r.target_logits for r in rows], L),
        {k: torch.stack([pad(r.hidden[k]) for r in rows]) for k in rows[0].hidden},
    )


class MasterAdamW:
    """AdamW over ``params`` whose update runs in float32 for half-precision parameters: each
    bfloat16/float16 parameter gets a float32 master copy that AdamW steps and that is copied back
    (mixed-precision training, Micikevicius et al. 2018, arXiv 1710.03740). Float32 parameters are
    stepped directly by the same ``torch.optim.AdamW``, exactly as without this class.

    Why: stepping half-precision parameters directly, float16 turns AdamW's ``eps`` (1e-8) into 0,
    so a zero gradient gives 0/0 = NaN (measured: every parameter of the micro policy NaN after one
    float16 step), and bfloat16 rounds away every update below 2^-8 of the weight (lr 1e-3 steps
    left weights of 1.0 unchanged). A step whose half-precision gradients are not finite is skipped
    (as torch's GradScaler does); no loss scaling, so float16 gradients below 6e-8 still underflow.
    """

    def __init__(self, params, **kw):
        self.params = list(params)
        self.master = [p if p.dtype == torch.float32 else p.detach().float().clone() for p in self.params]
        self.adamw = torch.optim.AdamW(self.master, **kw)  # the torch optimizer (a schedule drives its lr)

    @property
    def param_groups(self) -> list[dict]:
        return self.adamw.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in zip(self.params, self.master):
            if m is not p:
                p.grad = None  # the half-precision gradient; the float32 one is the master's
        self.adamw.zero_grad(set_to_none=set_to_none)

    def step(self) -> bool:
        """One AdamW step; False (nothing changed) when a half-precision gradient is inf/NaN."""
        half = [(p, m) for p, m in zip(self.params, self.master) if m is not p]
        for p, m in half:
            m.grad = None if p.grad is None else p.grad.float()
        grads = [m.grad for _, m in half if m.grad is not None]
        # One device->host read for all of them: a read per parameter (~300 for a 28-layer model)
        # would make the host wait for the device's queue at each one.
        if grads and not bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()):
            return False
        self.adamw.step()
        with torch.no_grad():
            for p, m in half:
                p.copy_(m)
        return True

    def state_dict(self) -> dict:
        return self.adamw.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """AdamW's state; the master copies are re-read from the parameters (loaded beside it)."""
        self.adamw.load_state_dict(state)
        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                if m is not p:
                    m.copy_(p)


class DraftOptimizer:
    """AdamW over ``drafter.train_parameters()``; with ``total_steps``, linear warmup and cosine decay to
    10 % of lr (:func:`workbench.models.schedule.warmup_cosine`, transformers' schedule); without
    (None, as online adaptation uses), a constant lr."""

    def __init__(
        self,
        drafter: Drafter,
        lr: float,
        total_steps: int | None = None,
        warmup: int = 10,
        max_grad_norm: float = 1.0,
        reduce_grads: Callable[[list[torch.nn.Parameter]], None] | None = None,
    ):
        if not drafter.trainable:
            raise ValueError(
                f"drafter.kind: {drafter.kind!r} has nothing to train; init/online need draft_model, mtp or eagle3"
            )
        self.drafter = drafter
        self.params = drafter.train_parameters()
        for p in self.params:
            p.requires_grad_(True)
        self.opt = MasterAdamW(self.params, lr=lr, weight_decay=0.0)
        self.sched = warmup_cosine(self.opt.adamw, warmup, total_steps) if total_steps is not None else None
        self.max_grad_norm = max_grad_norm
        self.reduce_grads = reduce_grads  # e.g. an all-reduce mean over data-parallel ranks, before clipping

    def step(self, batch: DraftBatch) -> dict[str, float]:
        self.opt.zero_grad(set_to_none=True)
        with torch.enable_grad():
            loss, stats = self.drafter.draft_loss(batch)
            loss.backward()
        if self.reduce_grads is not None:
            self.reduce_grads(self.params)
        torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        self.opt.step()
        if self.sched is not None:
            self.sched.step()
        self.drafter.after_update()
        return stats


@torch.no_grad()
def evaluate(drafter: Drafter, batch: DraftBatch) -> dict[str, float]:
    """``draft/loss`` and ``draft/top1_agreement`` on ``batch`` without updating anything."""
    _, stats = drafter.draft_loss(batch)
    return stats


def evaluate_rows(drafter: Drafter, rows: list[DraftBatch], batch_size: int = 16) -> dict[str, float]:
    """:func:`evaluate` over per-sequence ``rows`` in batches of ``batch_size`` (a batch's
    activations, not the whole held-out set's, in memory at once); each statistic averaged with the
    batches' masked positions as weights."""
    total: dict[str, float] = {}
    weight = 0.0
    for i in range(0, len(rows), batch_size):
        b = collate(rows[i : i + batch_size])
        w = float(b.loss_mask.sum())
        for k, v in evaluate(drafter, b).items():
            total[k] = total.get(k, 0.0) + w * v
        weight += w
    return {k: v / max(weight, 1.0) for k, v in total.items()}


def fit(
    drafter: Drafter,
    data: list[DraftBatch],
    steps: int,
    lr: float,
    batch_size: int,
    seed: int = 0,
    on_step: Callable[[int, dict], None] | None = None,
) -> list[dict[str, float]]:
    """Train ``drafter`` for ``steps`` optimiser steps on random minibatches of per-sequence ``data``."""
    opt = DraftOptimizer(drafter, lr, total_steps=steps)
    g = torch.Generator().manual_seed(seed)
    history = []
    for t in range(steps):
        idx = torch.randperm(len(data), generator=g)[:batch_size].tolist()
        st = opt.step(collate([data[i] for i in idx]))
        history.append(st)
        if on_step is not None:
            on_step(t, st)
    return history


def split_rows(batch: DraftBatch) -> list[DraftBatch]:
    """Per-sequence rows of a padded batch (trailing padding past the last masked position removed)."""
    buf = DraftBuffer(batch.input_ids.shape[0])
    buf.add(batch)
    return list(buf.rows)
