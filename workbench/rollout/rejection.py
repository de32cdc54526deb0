"""Modified rejection sampling for speculative decoding, batched, as one pure function.

Leviathan et al. 2023 (arXiv 2211.17192) and Chen et al. 2023 (arXiv 2302.01318); docs/design.md §4.
For draft position i with draft token x_i, draft distribution q_i and target distribution p_i:
accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection sample from
normalise(max(p_i - q_i, 0)) and stop; if every draft is accepted, sample the bonus token from
p_k. The emitted tokens are then distributed exactly as p. A deterministic drafter (n-gram) is
q_i = one-hot(x_i); greedy is p_i = one-hot(argmax), which accepts iff x_i is the argmax.

Rows may carry fewer than k real drafts (``num_draft[b] < k``, e.g. an n-gram with no match): a
position at or past ``num_draft[b]`` is not a draft, so the row emits a plain sample from p there,
exactly like a bonus token.
"""

from __future__ import annotations

import torch

from workbench.rollout.sampling import sample


def rejection_sample(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify k drafts per row against the target; return what each row emits.

    Args:
        target_probs: (B, k+1, V) processed target distribution p at each draft position and the
            bonus position.
        draft_tokens: (B, k) long draft tokens x (values past ``num_draft`` are ignored).
        draft_probs: (B, k, V) processed draft distribution q the drafts were sampled from, or
            None for deterministic drafts (q = one-hot(x)).
        num_draft: (B,) long number of real drafts per row, 0..k.
        generator: torch RNG for reproducible runs.
    Returns:
        num_accepted: (B,) long n_b in 0..num_draft[b].
        tokens: (B, k+1) long; row b emits ``tokens[b, :n_b + 1]`` (accepted drafts, then the
            correction or bonus token). Entries past n_b are meaningless.
    """
    B, k1, V = target_probs.shape
    k = k1 - 1
    dev = target_probs.device
    x = draft_tokens[..., None]  # (B, k, 1)
    p_x = target_probs[:, :k].gather(-1, x).squeeze(-1)  # (B, k)
    q_x = draft_probs.gather(-1, x).squeeze(-1) if draft_probs is not None else torch.ones_like(p_x)
    u = torch.rand(B, k, device=dev, generator=generator)
    is_draft = torch.arange(k, device=dev)[None, :] < num_draft[:, None]  # (B, k)
    accept = (u * q_x < p_x) & is_draft  # u < p/q without dividing by q
    num_accepted = accept.long().cumprod(-1).sum(-1)  # (B,) leading accepts

    # Distribution of the token at position n_b: residual after a rejected draft, else p itself.
    rows = torch.arange(B, device=dev)
    p_n = target_probs[rows, num_accepted]  # (B, V)
    rejected = num_accepted < num_draft  # (B,)
    # The residual is computed for every row (no `if rejected.any()`: that would read the device).
    n_clamped = num_accepted.clamp(max=k - 1)
    if draft_probs is not None:
        q_n = draft_probs[rows, n_clamped]
    else:
        q_n = torch.zeros_like(p_n).scatter_(-1, draft_tokens[rows, n_clamped][:, None], 1.0)
    residual = (p_n - q_n).clamp_min(0.0)
    mass = residual.sum(-1, keepdim=True)
    # mass == 0 only when p == q, where rejection has probability 0; fall back to p for safety.
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_n)
    p_n = torch.where(rejected[:, None], residual, p_n)
    last = sample(p_n, generator)  # (B,)

    tokens = torch.cat([draft_tokens, draft_tokens[:, :1]], dim=1).clone()  # (B, k+1)
    tokens[rows, num_accepted] = last
    return num_accepted, tokens
