"""GRPO policy loss: clipped ratio objective, k3 KL penalty, and the three token aggregations.

Sources (docs/design.md §4):
- GRPO objective and ``seq_mean_token_mean``: DeepSeekMath, arXiv 2402.03300.
- Asymmetric clip (clip-higher) and ``token_mean``: DAPO, arXiv 2503.14476.
- ``seq_mean_token_sum_norm`` (divide by the generation budget, not the sequence length):
  Dr. GRPO, arXiv 2503.20783.
- k3 KL estimator: J. Schulman, "Approximating KL divergence" (2020 blog post).

Shapes: B sequences (completions), T completion positions (right-padded), V vocabulary.
``mask`` is (B, T) with 1 on completion tokens that count and 0 on padding.
All log-probabilities are natural-log, per token.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOSS_AGGS: tuple[str, ...] = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm")


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimate of KL(pi_theta || pi_ref) from samples of pi_theta.

    With d = ref_logp - logp (log of pi_ref / pi_theta at the sampled token):
    KL_k3 = exp(d) - d - 1. Unbiased, always >= 0, low variance (Schulman's k3).

    Args: logp, ref_logp: (B, T). Returns: (B, T), differentiable w.r.t. both.
    """
    d = ref_logp - logp
    # expm1(d) - d == exp(d) - 1 - d, without cancellation when d is near 0 (the common case).
    return torch.expm1(d) - d


def _check_2d(per_token: Tensor, mask: Tensor) -> None:
    if per_token.dim() != 2 or per_token.shape != mask.shape:
        raise ValueError(
            f"per-token values and mask must both be (B, T); got {tuple(per_token.shape)} and {tuple(mask.shape)}"
        )


def aggregate(per_token: Tensor, mask: Tensor, loss_agg: str, max_len: int | None = None) -> Tensor:
    """Reduce per-token values (B, T) to a scalar over the valid tokens given by mask (B, T).

    - ``seq_mean_token_mean`` (GRPO): mean over each sequence's valid tokens, then mean over the
      B sequences. Long completions get less weight per token.
    - ``token_mean`` (DAPO): sum over all valid tokens / number of valid tokens; every token
      weighs the same, whatever its sequence length.
    - ``seq_mean_token_sum_norm`` (Dr. GRPO): each sequence's token sum / max_len (the constant
      generation budget), then mean over sequences, i.e. total / (B * max_len); no length bias.

    A sequence with no valid tokens contributes 0 (and still counts in the mean over sequences,
    as in TRL); an all-padding batch gives 0. Never NaN.

    Raises:
        ValueError: unknown loss_agg (lists the allowed names), shape mismatch, or
            ``seq_mean_token_sum_norm`` without a positive max_len.
    """
    _check_2d(per_token, mask)
    m = mask.to(per_token.dtype)
    masked = per_token * m
    if loss_agg == "seq_mean_token_mean":
        return (masked.sum(dim=1) / m.sum(dim=1).clamp(min=1.0)).mean()
    if loss_agg == "token_mean":
        return masked.sum() / m.sum().clamp(min=1.0)
    if loss_agg == "seq_mean_token_sum_norm":
        if max_len is None or max_len <= 0:
            raise ValueError(
                f"loss_agg 'seq_mean_token_sum_norm' needs max_len = the generation budget "
                f"(rollout.max_new_tokens) > 0, got {max_len!r}"
            )
        return (masked.sum(dim=1) / float(max_len)).mean()
    raise ValueError(f"unknown loss_agg {loss_agg!r}; allowed values: {', '.join(LOSS_AGGS)}")


def _masked_mean(x: Tensor, m: Tensor) -> float:
    return ((x * m).sum() / m.sum().clamp(min=1.0)).item()


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    max_len: int | None = None,
    is_weight: Tensor | None = None,
    kl_ratio_correction: bool = False,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped GRPO surrogate loss (to minimise) and its diagnostics.

    Per token: ratio = exp(logp - old_logp),
        objective = min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A) - beta * KL_k3
        loss = -aggregate(objective, mask, loss_agg, max_len)

    Args:
        logp: (B, T) current-policy logprobs of the sampled tokens; the gradient flows through it.
        old_logp: (B, T) logprobs under the policy that sampled the rollouts (detached here). With
            one optimiser step per batch, pi_old = pi_theta: pass ``logp.detach()`` (ratio 1, gradient
            A * grad logp, TRL's single iteration) instead of running the policy a second time.
        advantages: (B,) one advantage per sequence, broadcast over its tokens.
        mask: (B, T) 1 on valid completion tokens, 0 on padding.
        clip_low: epsilon_low of the clip range, 1 - clip_low (DAPO clip-higher).
        clip_high: epsilon_high of the clip range, 1 + clip_high (DAPO clip-higher).
        loss_agg: one of LOSS_AGGS.
        beta: k3 KL coefficient; needs ref_logp (B, T) when > 0 (detached here).
        max_len: generation budget, required by ``seq_mean_token_sum_norm``.
        kl_ratio_correction: multiply each token's KL by its (differentiable) ratio pi_theta / pi_old, so
            the KL gradient is the unbiased reverse-KL gradient (DeepSeek-V3.2, arXiv 2512.02556; TRL's
            ``use_bias_correction_kl``, its default since 1.x). False: the classic GRPO k3 penalty.
        is_weight: (B, T) per-token importance weight of the surrogate (detached here), e.g.
            :func:`truncated_is_weight` for rollouts of an older behaviour policy (asynchronous
            GRPO); None = 1.

    Returns:
        (loss scalar, stats) with stats as floats over valid tokens. ``clip_frac``: fraction of
            valid tokens where the clipped term is the active one and so carries no gradient, i.e.
            (ratio < 1 - clip_low and A < 0) or (ratio > 1 + clip_high and A > 0); TRL's
            ``clip_ratio/region_mean``. ``clip_frac_low`` / ``clip_frac_high`` are the two halves
            (TRL's ``clip_ratio/low_mean`` / ``high_mean``). ``kl``: mean k3 KL to the reference
            (0.0 without one). ``ratio_mean``: mean ratio (1.0 on-policy).

    Raises:
        ValueError: beta > 0 without ref_logp, bad shapes, or a bad loss_agg/max_len.
    """
    _check_2d(logp, mask)
    if old_logp.shape != logp.shape:
        raise ValueError(f"old_logp shape {tuple(old_logp.shape)} != logp shape {tuple(logp.shape)}")
    if advantages.shape != (logp.shape[0],):
        raise ValueError(f"advantages must be (B,) = ({logp.shape[0]},), got {tuple(advantages.shape)}")
    if beta > 0 and ref_logp is None:
        raise ValueError(
            "beta > 0 needs ref_logp (reference-model logprobs); set grpo.beta = 0 to train without a reference"
        )
    if ref_logp is not None and ref_logp.shape != logp.shape:
        raise ValueError(f"ref_logp shape {tuple(ref_logp.shape)} != logp shape {tuple(logp.shape)}")

    # Old and reference logprobs are constants of the update: only the current policy is trained.
    ratio = torch.exp(logp - old_logp.detach())
    adv = advantages.detach().to(logp.dtype).unsqueeze(1)  # (B, 1), same for every token
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    # min() is the pessimistic bound: once the ratio has moved past the clip in the direction the
    # advantage rewards, the constant clipped term wins and the token stops pushing.
    objective = torch.minimum(unclipped, clipped)
    if is_weight is not None:
        if is_weight.shape != logp.shape:
            raise ValueError(f"is_weight shape {tuple(is_weight.shape)} != logp shape {tuple(logp.shape)}")
        objective = objective * is_weight.detach()

    kl = None
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp.detach())
        if beta > 0:
            objective = objective - beta * (kl * ratio if kl_ratio_correction else kl)

    loss = -aggregate(objective, mask, loss_agg, max_len)

    with torch.no_grad():
        m = mask.to(ratio.dtype)
        low = (ratio < 1.0 - clip_low) & (adv < 0)
        high = (ratio > 1.0 + clip_high) & (adv > 0)
        stats = {
            "clip_frac": _masked_mean((low | high).to(m.dtype), m),
            "clip_frac_low": _masked_mean(low.to(m.dtype), m),
            "clip_frac_high": _masked_mean(high.to(m.dtype), m),
            "kl": _masked_mean(kl, m) if kl is not None else 0.0,
            "ratio_mean": _masked_mean(ratio, m),
        }
    return loss, stats


def truncated_is_weight(old_logp: Tensor, behaviour_logp: Tensor, cap: float) -> Tensor:
    """Truncated importance weight min(pi_old / pi_behaviour, cap) per token, (B, T) -> (B, T).

    For rollouts sampled by an older (behaviour) policy, as in asynchronous GRPO: the clipped
    surrogate is taken against pi_old, and each token is reweighted by how much more likely pi_old
    makes it than the policy that sampled it, truncated at ``cap`` so rare tokens cannot blow up
    the variance (truncated IS: Ionides 2008; Yao et al. 2025 for RL with LLMs, verl's
    ``tis_imp_ratio_cap``). Both inputs are detached log-probabilities.
    """
    return torch.exp(old_logp.detach() - behaviour_logp.detach()).clamp(max=cap)


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """Log-probability of each given token under softmax(logits / temperature).

    Args:
        logits: (B, T, V) logits that predict ``tokens`` (already shifted: logits[:, t] scores tokens[:, t]).
        tokens: (B, T) int64 token ids.
        temperature: the rollout temperature, so logprobs match the sampling distribution;
            0 (greedy) is treated as 1, since greedy has no proper distribution to match.

    Returns:
        (B, T) float32 logprobs (float64 if logits are float64).

    Computed as gathered logit - logsumexp, which never materialises the (B, T, V) log_softmax;
    low-precision logits are upcast to float32 because bf16 logsumexp loses ~2 digits.

    Raises:
        ValueError: negative temperature or mismatched shapes.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(
            f"logits must be (B, T, V) and tokens (B, T); got {tuple(logits.shape)} and {tuple(tokens.shape)}"
        )
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    picked = logits.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


__all__ = ["LOSS_AGGS", "aggregate", "grpo_loss", "kl_k3", "token_logprobs"]
