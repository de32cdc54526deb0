"""Group-relative advantages for GRPO (docs/design.md §4).

GRPO (DeepSeekMath, arXiv 2402.03300) samples G completions per prompt and uses the reward of each
completion relative to its siblings as the advantage, instead of a learned value baseline:

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

Dr. GRPO (arXiv 2503.20783) drops the division by the std, which otherwise up-weights groups whose
rewards barely differ (too-easy or too-hard prompts): ``scale_rewards=False``.

Layout convention, shared with the rollout engine: rows are grouped consecutively, so rows
``[g*G : (g+1)*G]`` are the G samples of prompt g.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """(N,) -> (N // G, G) view; raises ValueError on a bad shape or a G that does not divide N."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (N,), got shape {tuple(rewards.shape)}")
    if group_size < 1:
        raise ValueError(f"grpo.group_size must be >= 1, got {group_size}")
    n = rewards.shape[0]
    if n % group_size != 0:
        raise ValueError(
            f"number of rewards ({n}) is not divisible by grpo.group_size ({group_size}); "
            f"rows must be whole groups of G consecutive samples per prompt"
        )
    return rewards.reshape(n // group_size, group_size)


def group_advantages(
    rewards: Tensor, group_size: int, scale_rewards: bool = True, eps: float = 1e-6
) -> Tensor:
    """Per-sample GRPO advantage, the same for every token of that sample.

    Args:
        rewards: (N,) scalar reward per completion, N = num_prompts * G, groups consecutive.
        group_size: G, samples per prompt.
        scale_rewards: divide by the group std (DeepSeekMath GRPO); False = Dr. GRPO (centre only).
        eps: added to the std so all-equal groups give 0 rather than 0/0.

    Returns:
        (N,) float32 advantages (float64 if rewards are float64).

    The std is the *unbiased* sample std (Bessel's correction, ``torch.std`` default), the same
    as TRL's GRPOTrainer, so numbers match runs people compare against. With G = 1 the unbiased
    std is undefined; we then use 0 (the centred reward is 0 anyway, so A = 0, not NaN).

    Raises:
        ValueError: rewards not 1-D, group_size < 1, or N not divisible by group_size.
    """
    r = _grouped(rewards if rewards.is_floating_point() else rewards.float(), group_size)
    centred = r - r.mean(dim=1, keepdim=True)
    if scale_rewards:
        std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
        centred = centred / (std + eps)
    return centred.reshape(-1)


def frac_zero_std(rewards: Tensor, group_size: int) -> float:
    """Fraction of groups whose G rewards are all equal: their advantages are all 0, no signal.

    DAPO (arXiv 2503.14476, "dynamic sampling") drops such groups; we log the fraction either way.
    Returns 0.0 for an empty batch. Raises ValueError like ``group_advantages``.
    """
    r = _grouped(rewards, group_size)
    if r.shape[0] == 0:
        return 0.0
    # max == min is exact equality, immune to the rounding of a computed std.
    flat = r.amax(dim=1) == r.amin(dim=1)
    return flat.float().mean().item()
