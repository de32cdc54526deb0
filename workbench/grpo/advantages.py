"""Group-relative advantages for GRPO (docs/design.md §4).

GRPO (DeepSeekMath, arXiv 2402.03300) samples G completions per prompt and uses the reward of each
completion relative to its siblings as the advantage, instead of a learned value baseline:

    A_i = (r_i - mean(r_group)) / (std(r_group) + eps)

Dr. GRPO (arXiv 2503.20783) drops the division by the std, which otherwise up-weights groups whose
rewards barely differ (too-easy or too-hard prompts): ``scale_rewards="none"``.

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


SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")  # TRL's GRPOConfig.scale_rewards values


def equal_groups(rewards: Tensor, group_size: int) -> Tensor:
    """(N,) -> (N // G,) bool: True where a group's G rewards are all exactly equal (max == min,
    immune to the rounding of a computed mean or std). Raises ValueError like ``group_advantages``."""
    r = _grouped(rewards, group_size)
    return r.amax(dim=1) == r.amin(dim=1)


def group_advantages(
    rewards: Tensor,
    group_size: int,
    scale_rewards: str | bool = "group",
    eps: float = 1e-6,
    batch_std: Tensor | float | None = None,
) -> Tensor:
    """Per-sample GRPO advantage, the same for every token of that sample.

    Args:
        rewards: (N,) scalar reward per completion, N = num_prompts * G, groups consecutive.
        group_size: G, samples per prompt.
        scale_rewards: ``"group"`` divides by the group's std (DeepSeekMath GRPO); ``"batch"`` by the
            std of the whole batch's rewards (TRL's ``scale_rewards="batch"``, after "REINFORCE++",
            arXiv 2501.03262, and Liu et al.'s "Part I: Tricks or Traps?", arXiv 2508.08221);
            ``"none"`` centres only (Dr. GRPO). True / False mean "group" / "none", as in TRL.
        eps: added to the std so a small spread is not blown up; TRL uses 1e-4 (see below).
        batch_std: the batch std to use with ``"batch"`` (with data-parallel ranks: the std of every
            rank's rewards); None = the std of ``rewards``.

    Returns:
        (N,) float32 advantages (float64 if rewards are float64). A group whose G rewards are all
        equal gets exactly 0 for every member, whatever ``scale_rewards`` and ``eps``.

    Why the all-equal rule: the float32 mean of G equal rewards that are not binary fractions
    (1.2, 0.7, 0.3) is one ulp off, and that ulp divided by std + eps with std ~ 0 gives every
    member the same non-zero advantage (measured before: 8 rewards of 1.2 gave +0.106 each at
    eps 1e-6), pushing a whole all-correct group up and an all-wrong one down. TRL's larger eps
    (1e-4) shrinks the same error to ~1e-3; zeroing equal groups removes it, so such a batch has
    exactly zero gradient and the trainer skips its optimiser step. On groups with a spread the
    two agree to within eps's effect (the TRL cross-check in tests/test_trl_oracle.py).

    The std is the *unbiased* sample std (Bessel's correction, ``torch.std`` default), as TRL's
    GRPOTrainer. With G = 1 the unbiased std is undefined; the advantage is then 0 (not NaN).

    Raises:
        ValueError: rewards not 1-D, group_size < 1, N not divisible by group_size, or an unknown
            scale_rewards (names the allowed values).
    """
    mode = (
        {True: "group", False: "none"}.get(scale_rewards, scale_rewards)
        if isinstance(scale_rewards, bool)
        else scale_rewards
    )
    if mode not in SCALE_REWARDS:
        raise ValueError(f"grpo.scale_rewards must be one of {', '.join(SCALE_REWARDS)}, got {scale_rewards!r}")
    r = _grouped(rewards if rewards.is_floating_point() else rewards.float(), group_size)  # (P, G)
    centred = r - r.mean(dim=1, keepdim=True)  # (P, G)
    if mode == "group":
        std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])  # (P, 1)
        centred = centred / (std + eps)
    elif mode == "batch":
        if batch_std is None:
            batch_std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype, device=r.device)
        centred = centred / (torch.as_tensor(batch_std, dtype=r.dtype, device=r.device) + eps)
    flat = (r.amax(dim=1) == r.amin(dim=1)).unsqueeze(1)  # (P, 1): no signal in these groups
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


def has_learning_signal(advantages: Tensor, beta: float = 0.0) -> bool:
    """False when the GRPO loss's gradient is exactly zero: every advantage (N,) is 0 and there is no
    KL term (``beta`` 0, or no reference). The surrogate is A times a ratio, so A = 0 everywhere leaves
    nothing to differentiate; the trainer then runs no backward and takes no optimiser step."""
    return beta > 0.0 or bool((advantages != 0).any())


def frac_zero_std(rewards: Tensor, group_size: int) -> float:
    """Fraction of groups whose G rewards are all equal: their advantages are all 0, no signal.

    DAPO (arXiv 2503.14476, "dynamic sampling") drops such groups; we log the fraction either way.
    Returns 0.0 for an empty batch. Raises ValueError like ``group_advantages``.
    """
    flat = equal_groups(rewards, group_size)
    return flat.float().mean().item() if flat.numel() else 0.0
