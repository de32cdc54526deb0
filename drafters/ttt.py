"""The training-time test (TTT) of the chain drafters (``mtp``, ``eagle3``): the draft chain unrolled
over every start position at once, as it runs at inference.

Training (TTT, EAGLE-3 arXiv 2503.01840; SpecForge): for every start position s, step j's query
sits at position s+j, reads token s+j+1, attends to the real keys at positions <= s and to the
draft keys of steps 1..j of the same start (what it would see at inference), and is trained with a
soft cross-entropy against the target's distribution at position s+j+1, weighted ``decay**j``.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from drafters.targets import DraftBatch, extend_time, soft_ce, target_argmax, target_distribution, temper


def ttt_kv_fn(step_keys: list[tuple[torch.Tensor, torch.Tensor]], L: int, device):
    """kv_fn of TTT step j = len(step_keys): keys of step 0 (causal) and of steps 1..j (diagonal).

    step_keys[i] = (k_i, v_i) (N, L, Hkv, D); the new step's k/v are appended by the call.
    Mask (1, 1, L, L*(j+1)): block 0 [s, t] = t <= s; block i >= 1 [s, s'] = s' == s.
    """

    def fn(k, v):
        step_keys.append((k, v))
        causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
        eye = torch.eye(L, dtype=torch.bool, device=device)
        mask = torch.cat([causal] + [eye] * (len(step_keys) - 1), dim=1)  # (L, L*(j+1))
        keys = torch.cat([kk for kk, _ in step_keys], dim=1)  # (N, L*(j+1), Hkv, D)
        vals = torch.cat([vv for _, vv in step_keys], dim=1)
        return keys, vals, mask[None, None]

    return fn


def ttt_loss(
    net: nn.Module, batch: DraftBatch, steps: int, decay: float, restrict=None, temperature: float = 1.0
) -> tuple[torch.Tensor, dict]:
    """Training-time-test loss of a chain drafter's net (:class:`drafters.chain.ChainNet`) on ``batch``
    (see module doc).

    Args:
        steps: unroll depth S (EAGLE-3 uses 7); ``decay``: weight of step j is decay**j.
        restrict: optional (d2t (Vd,) draft -> target ids, t2d (V,) target -> draft id or -1)
            (eagle3's draft vocabulary): the target distribution is restricted to those ids and
            renormalised (:func:`drafters.targets.target_distribution`).
        temperature: distillation temperature; draft and target logits are divided by it
            (``drafter.distill_temperature``).
    Returns:
        (scalar loss = sum_j decay**j * mean masked soft-CE of step j, stats with ``draft/loss_step_j``
        and ``draft/top1_agreement`` of step 0: argmax draft (mapped to target ids) == argmax target).
    """
    ids, mask, tl = batch.input_ids, batch.loss_mask, batch.target_logits
    N, L = ids.shape
    dev = ids.device
    feat = net.fuse(batch.hidden)  # (N, L, H)
    step_keys: list = []
    pos0 = torch.arange(L, device=dev)[None, :].expand(N, L)
    total = torch.zeros((), device=dev)
    stats: dict[str, float] = {}
    pad = torch.zeros(N, steps + 1, dtype=ids.dtype, device=dev)
    ids_p = torch.cat([ids, pad], 1)  # (N, L+S+1)
    tl_p = extend_time(tl, steps + 1)  # (N, L+S+1, V) or top-K (N, L+S+1, K)
    mask_p = torch.cat([mask, torch.zeros(N, steps + 1, device=dev, dtype=mask.dtype)], 1)
    for j in range(steps):
        tok = ids_p[:, j + 1 : j + 1 + L]  # (N, L) token s+j+1
        out = net.block(
            j,
            feat,
            net.embed(tok),
            (pos0 + j).clamp_max(net.cfg.max_position_embeddings - 1),
            ttt_kv_fn(step_keys, L, dev),
        )
        w = mask_p[:, j + 1 : j + 1 + L]  # (N, L)
        # the head and the loss only where the step is scored (about half the positions are the
        # prompt's): the head is most of a step's cost for a large draft vocabulary
        at = w > 0  # (N, L) bool
        logits = net.head(j, out[at])  # (M, Vd)
        t_logits = tl_p[:, j + 1 : j + 1 + L][at]  # (M, V) / top-K (M, K): target at s+j+1
        w = w[at]  # (M,)
        probs, cols = target_distribution(temper(t_logits, temperature), *(restrict or (None, None)))
        ce = soft_ce(temper(logits, temperature), probs, cols)  # (M,)
        lj = (ce * w).sum() / w.sum().clamp_min(1)
        total = total + decay**j * lj
        stats[f"draft/loss_step_{j}"] = float(lj.detach())
        if j == 0:
            pred = logits.argmax(-1)
            pred = pred if restrict is None else restrict[0][pred]
            agree = (pred == target_argmax(t_logits)).float()
            stats["draft/top1_agreement"] = float((agree * w).sum() / w.sum().clamp_min(1))
        feat = out
    stats["draft/loss"] = float(total.detach())
    return total, stats
