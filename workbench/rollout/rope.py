"""Rotary position embeddings (RoFormer, Su et al. 2021) in the rotate-half form transformers uses.

The tables hold cos/sin for every position 0..P-1 in float32, computed once per model, so one
forward (eager or compiled) only gathers rows. Their inverse frequencies and attention scaling
come from transformers itself for every scaled RoPE (``ROPE_INIT_FUNCTIONS`` in
``transformers.modeling_rope_utils``: ``linear``, ``llama3`` (the Llama 3.1 recipe: low/high
frequency factors around ``original_max_position_embeddings``), ``yarn``), so they are the numbers
``LlamaRotaryEmbedding`` / ``Qwen3RotaryEmbedding`` compute, not a re-derivation; the default RoPE
is the one-line formula those classes' ``compute_default_rope_parameters`` use (bit-identical).
As there, cos and sin are multiplied by the attention scaling (yarn's mscale; 1 otherwise) in
float32 and cast to the activations' dtype at use.

Shapes: P the table length (``max_position_embeddings``), D the head dim, B rows, T positions.
"""

from __future__ import annotations

from typing import Any

import torch

SCALED_ROPE_TYPES = ("linear", "llama3", "yarn")  # position-independent scalings transformers computes once


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (..., D): [x1, x2] -> [-x2, x1] with x1, x2 the two halves of the last dim."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def default_inv_freq(theta: float, head_dim: int, device=None) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies theta^(-2i/D), i = 0..D/2-1 (transformers' default RoPE)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))


def hf_inv_freq(cfg: Any, device=None) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (D/2,) float32 and attention scaling of ``cfg``'s scaled RoPE, computed by
    transformers' ``ROPE_INIT_FUNCTIONS[cfg.rope_scaling["rope_type"]]``.

    ``cfg``: an :class:`~workbench.rollout.arch.LMConfig` with ``rope_scaling`` set. The function is
    handed a ``LlamaConfig`` carrying the fields it reads (head_dim, max_position_embeddings,
    rope_theta and the scaling dict), built with the ``rope_theta``/``rope_scaling`` keywords that
    transformers 4.x and 5.x both accept.
    """
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = dict(cfg.rope_scaling)
    hf = LlamaConfig(
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        rope_scaling=scaling,
    )
    inv_freq, scale = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, device)
    return inv_freq.to(device=device, dtype=torch.float32), float(scale)


def rope_tables(cfg: Any, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE cos/sin tables (P, D) float32 for every position 0..P-1 of ``cfg`` (an ``LMConfig``:
    P = max_position_embeddings, D = head_dim, base rope_theta, scaling ``rope_scaling`` or None)."""
    if cfg.rope_scaling:
        inv_freq, scale = hf_inv_freq(cfg, device)
    else:
        inv_freq, scale = default_inv_freq(cfg.rope_theta, cfg.head_dim, device), 1.0
    # (P, D/2)
    freqs = torch.arange(cfg.max_position_embeddings, dtype=torch.float32, device=device)[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)  # (P, D)
    if scale == 1.0:
        return emb.cos(), emb.sin()
    return emb.cos() * scale, emb.sin() * scale


def rope_cos_sin(
    cos_table: torch.Tensor, sin_table: torch.Tensor, pos: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables' rows at positions ``pos`` (B, T) long -> cos, sin (B, T, 1, D) in ``dtype`` (broadcast over
    heads)."""
    return cos_table[pos][:, :, None, :].to(dtype), sin_table[pos][:, :, None, :].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys x (B, T, heads, D) by their positions' angles, cos/sin (B, T, 1, D)."""
    return x * cos + rotate_half(x) * sin
