"""Engine-vs-trainer log-probabilities of the sampled tokens: two honest diagnostics.

The rollout engine records log p of every token it samples under the *processed* distribution
it samples from (temperature, then top-k, then top-p: :func:`workbench.rollout.sampling.probs_from_logits`).
The trainer trains on temperature-only log p (:func:`workbench.grpo.loss.token_logprobs`). Their
difference mixes two things, reported apart (per completion token, mean absolute, nats):

- ``gen/logprob_abs_diff``: |engine log p - trainer log p under the engine's own processing|, the
  numeric engine/trainer mismatch (what verl and NeMo RL call the training-inference logprob
  mismatch: different kernels, dtypes or weights). ~0 for identical weights in float32.
- ``gen/logprob_truncation_abs_diff``: |trainer processed log p - trainer temperature-only log p|,
  the effect of top-k/top-p (0 without them): the tokens the engine could not sample give the
  processed law more mass on the others. With greedy rollouts (temperature 0) the processed law
  is the one-hot argmax, so this is then the gap to the temperature-1 law the trainer uses.

Shapes: B sequences, T positions (aligned with the next-token targets), V vocabulary; ``mask``
(B, T) is 1 on completion tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from workbench.rollout.sampling import SamplingParams, probs_from_logits

LOG_TINY = math.log(torch.finfo(torch.float32).tiny)  # -87.3: log p of a token outside the processed support
CHUNK_TOKENS = 1024  # tokens processed at once: bounds the (chunk, V) sort/softmax buffers of top-p


def truncates(sp: SamplingParams, vocab_size: int) -> bool:
    """True when the engine's processing is more than a temperature: greedy, top-k < V, or top-p < 1."""
    return sp.greedy or 0 < sp.top_k < vocab_size or sp.top_p < 1.0


def processed_token_logprobs(logits: Tensor, tokens: Tensor, sp: SamplingParams, temp_logp: Tensor) -> Tensor:
    """log p(token) under the engine's processed law, from the trainer's logits.

    Args:
        logits: (M, V) logits that predict ``tokens`` (any float dtype).
        tokens: (M,) int64 token ids.
        sp: the rollout's sampling parameters (the engine's processing).
        temp_logp: (M,) the same tokens' temperature-only log p (token_logprobs), returned as is
            when the processing is a temperature only, so that the two agree exactly then.

    Returns:
        (M,) float32 nats. With truncation: log of ``probs_from_logits(logits, sp)`` at the token,
        the engine's own formula, so identical logits give identical values; a token outside the
        processed support (possible when engine and trainer logits differ at the top-k/top-p
        boundary) counts as ``LOG_TINY`` (-87.3) instead of -inf.
    """
    if not truncates(sp, logits.shape[-1]):
        return temp_logp.float()
    out = []
    for i in range(0, logits.shape[0], CHUNK_TOKENS):
        p = probs_from_logits(logits[i : i + CHUNK_TOKENS], sp)  # (m, V) float32
        out.append(p.gather(-1, tokens[i : i + CHUNK_TOKENS, None].long()).squeeze(-1).log().clamp_min(LOG_TINY))
    return torch.cat(out) if out else logits.new_zeros(0, dtype=torch.float32)


@torch.no_grad()
def logprob_gaps(
    logits: Tensor, tokens: Tensor, temp_logp: Tensor, engine_logp: Tensor, mask: Tensor, sp: SamplingParams
) -> tuple[Tensor, Tensor]:
    """Per-token |engine - trainer processed| and |trainer processed - trainer temperature-only| log p.

    Args:
        logits: (B, T, V) the trainer's logits predicting ``tokens`` (shifted: logits[:, t] scores tokens[:, t]).
        tokens: (B, T) int64 sampled token ids.
        temp_logp: (B, T) trainer's temperature-only log p of ``tokens`` (token_logprobs; detached here).
        engine_logp: (B, T) the engine's log p of ``tokens`` (processed law), 0 off the mask.
        mask: (B, T) 1 on completion tokens; only those are computed.
        sp: the rollout's sampling parameters.

    Returns:
        (mismatch, truncation): two (B, T) float32 tensors in nats, 0 off the mask; the means over
        the mask are ``gen/logprob_abs_diff`` and ``gen/logprob_truncation_abs_diff``.

    Raises:
        ValueError: mismatched shapes.
    """
    if logits.dim() != 3 or not (
        tokens.shape == temp_logp.shape == engine_logp.shape == mask.shape == logits.shape[:2]
    ):
        raise ValueError(
            f"logits must be (B, T, V) and tokens/temp_logp/engine_logp/mask (B, T); got {tuple(logits.shape)}, "
            f"{tuple(tokens.shape)}, {tuple(temp_logp.shape)}, {tuple(engine_logp.shape)}, {tuple(mask.shape)}"
        )
    sel = mask.bool()  # (B, T)
    temp = temp_logp.detach().float()[sel]  # (M,)
    proc = processed_token_logprobs(logits.detach()[sel], tokens[sel], sp, temp)  # (M,)
    mismatch = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    truncation = torch.zeros_like(mismatch)
    mismatch[sel] = (engine_logp.float()[sel] - proc).abs()
    truncation[sel] = (proc - temp).abs()
    return mismatch, truncation


__all__ = ["LOG_TINY", "logprob_gaps", "processed_token_logprobs", "truncates"]
