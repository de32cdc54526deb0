"""Building blocks of a Llama-family decoder layer, shared by the rollout model and the chain drafters.

Pure functions over plain tensors, so that one forward serves eager mode and ``torch.compile``
(:func:`workbench.rollout.model.lm_forward`) and the chain drafters (``mtp``, ``eagle3``) run the
very same maths as the target; and the small modules that hold their weights under Hugging Face's
parameter names. The references are transformers' ``modeling_llama``, ``modeling_qwen2``,
``modeling_qwen3`` and ``modeling_mistral`` (the rollout model's logits are tested against each,
``tests/test_architectures.py``): RMSNorm (Zhang & Sennrich 2019, statistics in float32), rotary
position embeddings (:mod:`workbench.rollout.rope`), grouped-query attention over a preallocated KV
cache under a position mask (causal, or causal within a sliding window: Mistral), optional q/k/v
biases (Qwen2) and per-head q/k RMSNorm before RoPE (Qwen3), and the SwiGLU MLP (Shazeer 2020).

Shapes: B rows, T new positions per row, Tk attended key positions, H query heads, Hkv key/value
heads, D head dim, P the position table length (``max_position_embeddings``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from workbench.rollout.packing import linear
from workbench.rollout.rope import apply_rope, rope_cos_sin, rope_tables, rotate_half  # noqa: F401  (importable from here)

# kv(k, v) -> (keys, vals, mask): stores the new keys/values (B, T, Hkv, D) wherever the caller
# keeps them and returns what the queries attend to: keys, vals (B, Tk, Hkv, D) and a bool mask
# (B or 1, 1, T, Tk), True = may attend.
KVFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
# A projection weight: one (out, in) tensor, or a tuple of them whose outputs are the parts (and
# likewise its bias: one (out,) tensor, a tuple of them, or None).
Weight = torch.Tensor | tuple[torch.Tensor, ...]
Bias = torch.Tensor | tuple[torch.Tensor, ...] | None


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Llama computes it: x (..., H) normalised in float32, cast back to x's dtype, times w (H,)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def position_mask(pos: torch.Tensor, tk: int, window: int | None = None) -> torch.Tensor:
    """Causal mask by position: query (b, t) at position pos[b, t] may read key positions <= it,
    and with a sliding ``window`` (tokens) only those > pos - window (the query and the window - 1
    before it: transformers' ``sliding_window_overlay``, Mistral).

    pos (B, T) long -> (B, 1, T, tk) bool (broadcast over heads). Key positions past a row's own
    are never read, so stale entries there (rejected drafts, another row's longer length) are harmless.
    """
    keys = torch.arange(tk, device=pos.device)[None, None, :]  # (1, 1, tk)
    mask = keys <= pos[:, :, None]  # (B, T, tk)
    if window is not None:
        mask = mask & (keys > pos[:, :, None] - window)
    return mask[:, None]


def cache_kv(
    cache_k: torch.Tensor, cache_v: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, tk: int
) -> KVFn:
    """The :data:`KVFn` of attention over one layer of a preallocated cache (B, T_max, Hkv, D):
    writes the new k/v (B, T, Hkv, D) at (``rows``, ``pos``) (both (B, T) long) and attends to the
    first ``tk`` cache positions under ``mask`` (B, 1, T, tk)."""

    def kv(k: torch.Tensor, v: torch.Tensor):
        cache_k.index_put_((rows, pos), k)
        cache_v.index_put_((rows, pos), v)
        return cache_k[:, :tk], cache_v[:, :tk], mask

    return kv


def attend(q: torch.Tensor, keys: torch.Tensor, vals: torch.Tensor, mask: torch.Tensor, gqa: bool) -> torch.Tensor:
    """Scaled dot-product attention; ``gqa``: Hkv < H (grouped-query, each key/value head serves H/Hkv query heads).

    q (B, T, H, D), keys/vals (B, Tk, Hkv, D), mask (B or 1, 1, T, Tk) bool -> (B, T, H * D).
    ``gqa`` is passed, not read off ``keys``: under ``torch.compile`` a cache's dims are symbolic,
    and a symbolic bool here would break the graph (the whole forward would silently run eager).
    """
    B, T, H, D = q.shape
    # (B, H, T, D)
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        keys.transpose(1, 2),
        vals.transpose(1, 2),
        attn_mask=mask,
        enable_gqa=gqa,
    )
    return out.transpose(1, 2).reshape(B, T, H * D)


def project(x: torch.Tensor, w: Weight, sizes: tuple[int, ...], b: Bias = None) -> tuple[torch.Tensor, ...]:
    """x (..., in) through a projection whose output splits into parts of ``sizes``: one matmul of a
    fused weight (sum(sizes), in) (and bias (sum(sizes),)) split afterwards, or one matmul per
    weight of a tuple (and bias of a tuple of the same length)."""
    if isinstance(w, torch.Tensor):
        return linear(x, w, b).split(list(sizes), dim=-1)
    return tuple(linear(x, wi, None if b is None else bi) for wi, bi in zip(w, b if b is not None else w))


def _rows(w: Weight) -> int:
    return w.shape[0] if isinstance(w, torch.Tensor) else sum(wi.shape[0] for wi in w)


def attention(
    x: torch.Tensor,
    w_qkv: Weight,
    w_o: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVFn,
    b_qkv: Bias = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Self-attention of x (B, T, in) -> (B, T, hidden), Llama-family.

    w_qkv: the q/k/v projections ((H + 2 Hkv) D, in) fused, or a tuple (w_q, w_k, w_v); w_o
    (hidden, H D). b_qkv: their biases (Qwen2), fused ((H + 2 Hkv) D,) or a tuple, or None.
    qk_norm: the RMSNorm weights (D,), (D,) applied to each head of q and k BEFORE RoPE
    (Qwen3: ``q_norm``/``k_norm``, epsilon ``eps``), or None. cos/sin (B, T, 1, D) at the queries'
    positions (:func:`rope_cos_sin`); ``kv`` stores the new keys/values and returns what to attend
    to (:data:`KVFn`). The head counts are read off the weights' shapes (so under ``torch.compile``
    they are constants of the graph).
    """
    B, T, _ = x.shape
    D = cos.shape[-1]
    H = w_o.shape[1] // D
    Hkv = (_rows(w_qkv) - H * D) // (2 * D)
    q, k, v = project(x, w_qkv, (H * D, Hkv * D, Hkv * D), b_qkv)  # 3 x (B, T, heads * D)
    q, k, v = q.reshape(B, T, H, D), k.reshape(B, T, Hkv, D), v.reshape(B, T, Hkv, D)
    if qk_norm is not None:
        q, k = rms_norm(q, qk_norm[0], eps), rms_norm(k, qk_norm[1], eps)  # per head (..., D), modeling_qwen3
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    keys, vals, mask = kv(k, v)  # stores k, v (B, T, Hkv, D); returns what the queries attend to
    return linear(attend(q, keys, vals, mask, gqa=H != Hkv), w_o)


def mlp(x: torch.Tensor, w_gate_up: Weight, w_down: torch.Tensor) -> torch.Tensor:
    """SwiGLU MLP: down(silu(gate(x)) * up(x)); x (B, T, hidden) -> (B, T, hidden).

    w_gate_up: gate and up (2I, hidden) fused, or a tuple (w_gate, w_up); w_down (hidden, I).
    """
    inter = w_down.shape[1]
    gate, up = project(x, w_gate_up, (inter, inter))  # 2 x (B, T, inter)
    return linear(F.silu(gate) * up, w_down)


def decoder_layer(
    attn_in: torch.Tensor,
    resid: torch.Tensor,
    w_qkv: Weight,
    w_o: torch.Tensor,
    w_post: torch.Tensor,
    w_gate_up: Weight,
    w_down: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: KVFn,
    b_qkv: Bias = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """One pre-norm decoder layer from its attention input: h = resid + attention(attn_in);
    returns h + mlp(rms_norm(h, w_post)) (B, T, hidden). ``b_qkv``, ``qk_norm``: as :func:`attention`.

    A Llama layer passes attn_in = rms_norm(x, input norm), resid = x; a chain drafter's module
    builds both from its feature and token embedding (``drafters.chain``).
    """
    h = resid + attention(attn_in, w_qkv, w_o, cos, sin, kv, b_qkv, qk_norm, eps)
    return h + mlp(rms_norm(h, w_post, eps), w_gate_up, w_down)


class RMSNorm(nn.Module):
    """:func:`rms_norm` with its weight (H,) as a parameter."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class Attention(nn.Module):
    """The q/k/v/o projections of one attention layer (Hugging Face names): q/k/v biases when
    ``cfg.qkv_bias`` (Qwen2), per-head ``q_norm``/``k_norm`` (D,) when ``cfg.qk_norm`` (Qwen3).

    ``in_dim``: the input width (the hidden size; EAGLE-3's layer reads 2 x hidden).
    """

    def __init__(self, cfg: Any, in_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        d, in_dim, bias = cfg.head_dim, in_dim or cfg.hidden_size, getattr(cfg, "qkv_bias", False)
        self.q_proj = nn.Linear(in_dim, cfg.num_heads * d, bias=bias)
        self.k_proj = nn.Linear(in_dim, cfg.num_kv_heads * d, bias=bias)
        self.v_proj = nn.Linear(in_dim, cfg.num_kv_heads * d, bias=bias)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)
        if getattr(cfg, "qk_norm", False):
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def qkv_weight(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q_proj.weight, self.k_proj.weight, self.v_proj.weight

    def qkv_bias(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The q/k/v biases, or None without them."""
        return None if self.q_proj.bias is None else (self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)

    def qk_norm_weight(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The per-head q and k RMSNorm weights (D,), (D,), or None without them."""
        return (self.q_norm.weight, self.k_norm.weight) if hasattr(self, "q_norm") else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVFn) -> torch.Tensor:
        """:func:`attention` with this module's weights: x (B, T, in_dim) -> (B, T, hidden)."""
        return attention(
            x,
            self.qkv_weight(),
            self.o_proj.weight,
            cos,
            sin,
            kv,
            self.qkv_bias(),
            self.qk_norm_weight(),
            self.cfg.rms_norm_eps,
        )


class MLP(nn.Module):
    """The gate/up/down projections of a SwiGLU MLP (Hugging Face names, no biases)."""

    def __init__(self, cfg: Any):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def gate_up_weight(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.gate_proj.weight, self.up_proj.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """:func:`mlp` with this module's weights: (B, T, hidden) -> (B, T, hidden)."""
        return mlp(x, self.gate_up_weight(), self.down_proj.weight)
