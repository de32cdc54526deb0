"""A lean Llama-family forward for rollouts, with a preallocated KV cache and per-row positions.

Like gpt-fast and nano-vllm, generation does not go through transformers: this module loads the
Hugging Face weights (same parameter names, so ``load_state_dict(hf_model.state_dict())`` works)
and runs a minimal forward whose logits match ``LlamaForCausalLM`` to float tolerance (a test).

Per-row positions are what make batched speculative decoding with ragged acceptance simple: every
row b writes its new tokens into the cache at ``start_pos[b] + t`` and attends to cache positions
``<= start_pos[b] + t``. Cache entries beyond a row's accepted length are stale drafts; the
position mask never lets a query read them, and the next forward overwrites them. So no row is cut
back to the slowest one and nothing needs to be rolled back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class LMConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool

    @classmethod
    def from_hf(cls, cfg) -> "LMConfig":
        """From a transformers ``LlamaConfig``.

        Raises:
            ValueError: an architecture feature this forward does not implement (rope scaling,
                attention/MLP biases, another activation), so results would silently differ.
        """
        rope = getattr(cfg, "rope_scaling", None) or {}
        params = getattr(cfg, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", rope.get("type")) or params.get("rope_type", "default")
        if rope_type not in (None, "default"):
            raise ValueError(f"model: rope scaling {rope_type!r} is not supported by the workbench engine; use a checkpoint with default RoPE")
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise ValueError("model: attention/MLP biases are not supported by the workbench engine (Llama-family without biases only)")
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"model: activation {cfg.hidden_act!r} is not supported (silu only)")
        theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        heads = cfg.num_attention_heads
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
            intermediate_size=cfg.intermediate_size,
            rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=float(theta),
            max_position_embeddings=cfg.max_position_embeddings,
            tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class KVCache:
    """Preallocated per-layer keys/values, layout (B, T_max, H_kv, D) so rows scatter easily."""

    def __init__(self, cfg: LMConfig, batch: int, max_len: int, device, dtype):
        shape = (batch, max_len, cfg.num_kv_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)]
        self.max_len = max_len

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` (LongTensor of row indices), e.g. when finished sequences leave."""
        self.k = [t.index_select(0, rows) for t in self.k]
        self.v = [t.index_select(0, rows) for t in self.v]


class Attention(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        h, d = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(h, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, h, bias=False)

    def forward(self, x, cos, sin, cache_k, cache_v, rows, cols, mask, tk):
        B, T, _ = x.shape
        c = self.cfg
        q = self.q_proj(x).view(B, T, c.num_heads, c.head_dim)
        k = self.k_proj(x).view(B, T, c.num_kv_heads, c.head_dim)
        v = self.v_proj(x).view(B, T, c.num_kv_heads, c.head_dim)
        q = q * cos + rotate_half(q) * sin  # cos/sin: (B, T, 1, D)
        k = k * cos + rotate_half(k) * sin
        cache_k[rows, cols] = k  # rows/cols: (B, T) -> writes (B, T, H_kv, D)
        cache_v[rows, cols] = v
        keys = cache_k[:, :tk].transpose(1, 2)  # (B, H_kv, Tk, D)
        vals = cache_v[:, :tk].transpose(1, 2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, vals, attn_mask=mask, enable_gqa=c.num_heads != c.num_kv_heads
        )  # (B, H, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim))


class MLP(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _Body(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LeanLM(nn.Module):
    """Inference-only Llama forward over a KV cache with per-row start positions.

    Parameter names mirror transformers' ``LlamaForCausalLM`` (``model.layers.0.self_attn.q_proj``
    ...), so weights load with ``load_state_dict`` and sync from a trainer without renaming.
    """

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.model = _Body(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._init_rope()
        self.requires_grad_(False)

    def _init_rope(self) -> None:
        """RoPE cos/sin tables (P, D) for every position, in float32 whatever the weights' dtype."""
        cfg, dev = self.cfg, self.lm_head.weight.device
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device=dev) / cfg.head_dim))
        freqs = torch.arange(cfg.max_position_embeddings, dtype=torch.float32, device=dev)[:, None] * inv_freq  # (P, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (P, D)
        self.register_buffer("rope_cos", emb.cos(), persistent=False)
        self.register_buffer("rope_sin", emb.sin(), persistent=False)

    @classmethod
    def from_hf(cls, hf_model: nn.Module) -> "LeanLM":
        """Build from a transformers ``LlamaForCausalLM`` (same device/dtype), copying its weights."""
        p = next(hf_model.parameters())
        lm = cls(LMConfig.from_hf(hf_model.config)).to(device=p.device, dtype=p.dtype)
        lm._init_rope()  # .to(dtype) also cast the tables; rebuild them in float32
        lm.load_weights(hf_model)
        return lm.eval()

    @torch.no_grad()
    def load_weights(self, hf_model: nn.Module) -> None:
        """Copy the trainer's current weights in place (the `prepare` stage's weight sync)."""
        missing, unexpected = self.load_state_dict(hf_model.state_dict(), strict=False)
        fused = self.__dict__.get("_fused")
        if fused is not None and any(l.self_attn.q_proj.weight.data_ptr() != f[0].data_ptr() or l.mlp.gate_proj.weight.data_ptr() != f[1].data_ptr()
                                     for l, f in zip(self.model.layers, fused)):
            self._fuse_weights()  # something replaced the weights instead of copying into them
        if fused is not None:
            self.__dict__["_flat"] = self._flat_weights()  # the compiled step's references, current again
        missing = [m for m in missing if not (self.cfg.tie_word_embeddings and m == "lm_head.weight")]
        if missing or [u for u in unexpected if "rotary" not in u]:
            raise ValueError(f"model: weights do not match a Llama layout (missing {missing[:4]}, unexpected {unexpected[:4]})")

    def enable_compile(self) -> None:
        """Run plain forwards (no hidden states, no ``logits_col``: decode and verification steps)
        through ``torch.compile`` (inductor, dynamic shapes) of :func:`static_forward`.

        The first calls of each new shape class compile (tens of seconds on CPU; a C++ compiler is
        needed there); afterwards a small model's step is one fused kernel sequence instead of ~100
        eager ops (measured in benchmarks/engine-optimisation-log.md). Same logits to float tolerance.
        """
        self._fuse_weights()
        self.__dict__["_flat"] = self._flat_weights()
        # Target and draft share static_forward's compile cache, and batch 1 / one token per row
        # are specialised graphs, so a benchmark meets > 8 variants; past TorchDynamo's default
        # limit of 8 it silently runs eager. Raised as vLLM does (its compilation config).
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), 64))
        self._compiled = torch.compile(static_forward, dynamic=True)

    def _flat_weights(self) -> list[torch.Tensor]:
        """The compiled step's weights as one flat list (see :func:`static_forward`): passing plain
        tensors instead of the module saves TorchDynamo walking and guarding ~30 module attributes
        on every call. The entries are the parameters themselves (or the fused tensors they view),
        so the in-place weight sync reaches them."""
        m = self.model
        flat = [m.embed_tokens.weight, self.rope_cos, self.rope_sin]
        for layer, (w_qkv, w_gu) in zip(m.layers, self.__dict__["_fused"]):
            flat += [layer.input_layernorm.weight, w_qkv, layer.self_attn.o_proj.weight,
                     layer.post_attention_layernorm.weight, w_gu, layer.mlp.down_proj.weight]
        flat += [m.norm.weight, self.lm_head.weight]
        for t in flat:
            torch._dynamo.mark_static(t)  # weight shapes are constants of the graph (dynamic=True would make them symbolic)
        return flat

    def _fuse_weights(self) -> None:
        """Per layer, one (q+k+v, H) and one (2I, H) weight: fewer, larger matmuls in the compiled
        step (6-14 % faster at batch 1-8, benchmarks/engine-optimisation-log.md). The Linears'
        weights become views into them, so the in-place weight sync (``load_weights``) updates both."""
        fused = []
        for layer in self.model.layers:
            a, m = layer.self_attn, layer.mlp
            fused.append((_fuse([a.q_proj, a.k_proj, a.v_proj]), _fuse([m.gate_proj, m.up_proj])))
        self.__dict__["_fused"] = fused  # plain attribute: not parameters, not in state_dict

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        if max_len > self.cfg.max_position_embeddings:
            raise ValueError(
                f"rollout: prompt + max_new_tokens + k needs {max_len} positions but the model has "
                f"max_position_embeddings={self.cfg.max_position_embeddings}; lower rollout.max_new_tokens"
            )
        w = self.lm_head.weight
        return KVCache(self.cfg, batch, max_len, w.device, w.dtype)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        start_pos: torch.Tensor,
        cache: KVCache,
        hidden_layers: tuple[int, ...] = (),
        logits_col: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Run ``input_ids`` (B, T) at positions ``start_pos[b] + t``; write K/V into ``cache``.

        Args:
            input_ids: (B, T) long token ids.
            start_pos: (B,) long position of column 0 of each row.
            cache: the batch's KV cache; rows must match B.
            hidden_layers: indices i whose *input* hidden state (B, T, H) is returned
                (i == num_layers: the last layer's output before the final norm).
            logits_col: (B,) long; if given, logits only at column ``logits_col[b]`` of each row,
                (B, 1, V) (prefill of right-padded prompts needs just each row's last token).
        Returns:
            logits (B, T, V) float32 and ``{i: hidden (B, T, H)}``.
        """
        compiled = self.__dict__.get("_compiled")
        if compiled is not None and not hidden_layers and logits_col is None:
            # attend over the cache up to the longest row, rounded up to a multiple of 32 so the
            # compiled graph sees few distinct lengths (one host read of the positions, as eager does)
            need = int(start_pos.max()) + input_ids.shape[1]
            tk = min(cache.max_len, -(-need // 32) * 32)
            return compiled(self.cfg.rms_norm_eps, self.__dict__["_flat"], input_ids, start_pos, cache.k, cache.v, tk), {}
        B, T = input_ids.shape
        dev = input_ids.device
        offs = torch.arange(T, device=dev)
        pos = start_pos[:, None] + offs[None, :]  # (B, T)
        tk = int(pos.max()) + 1
        rows = torch.arange(B, device=dev)[:, None].expand(B, T)
        mask = torch.arange(tk, device=dev)[None, None, :] <= pos[:, :, None]  # (B, T, Tk)
        mask = mask[:, None]  # (B, 1, T, Tk) broadcast over heads
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[pos][:, :, None, :].to(x.dtype)  # (B, T, 1, D)
        sin = self.rope_sin[pos][:, :, None, :].to(x.dtype)
        hidden: dict[int, torch.Tensor] = {}
        for i, layer in enumerate(self.model.layers):
            if i in hidden_layers:
                hidden[i] = x
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, cos, sin, cache.k[i], cache.v[i], rows, pos, mask, tk)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if self.cfg.num_layers in hidden_layers:
            hidden[self.cfg.num_layers] = x
        if logits_col is not None:
            x = x[torch.arange(B, device=dev), logits_col][:, None]  # (B, 1, H)
        logits = self.lm_head(self.model.norm(x)).float()
        return logits, hidden


def _fuse(linears: list[nn.Linear]) -> torch.Tensor:
    """Concatenate the Linears' weights (rows) and make each weight a view into the result."""
    fused = torch.cat([l.weight.detach() for l in linears], 0)
    off = 0
    for l in linears:
        n = l.weight.shape[0]
        l.weight.data = fused[off : off + n]
        off += n
    return fused


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """:class:`RMSNorm` as a function (float32 statistics)."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def static_forward(eps: float, W: list, input_ids: torch.Tensor, start_pos: torch.Tensor, ks: list, vs: list, tk: int) -> torch.Tensor:
    """``LeanLM.forward`` for ``torch.compile``, on plain tensors: ``eps`` the RMSNorm epsilon;
    ``W`` = :meth:`LeanLM._flat_weights` (static shapes: embedding, RoPE
    tables, per layer [input norm, fused q/k/v, o, post-attention norm, fused gate/up, down], final
    norm, LM head). Attends over the first ``tk`` cache positions (a bucketed length >= every
    row's last position + 1, given by the caller, so the graph has no data-dependent shape) under
    the position mask. input_ids (B, T), start_pos (B,) -> logits (B, T, V).
    """
    D = W[1].shape[-1]
    H = W[5].shape[1] // D  # o_proj (hidden, H * D)
    Hkv = (W[4].shape[0] - H * D) // (2 * D)  # fused q/k/v ((H + 2 Hkv) D, hidden)
    B, T = input_ids.shape
    dev = input_ids.device
    pos = start_pos[:, None] + torch.arange(T, device=dev)[None, :]  # (B, T)
    mask = (torch.arange(tk, device=dev)[None, None, :] <= pos[:, :, None])[:, None]  # (B, 1, T, tk)
    rows = torch.arange(B, device=dev)[:, None].expand(B, T)
    x = F.embedding(input_ids, W[0])
    cos = W[1][pos][:, :, None, :].to(x.dtype)  # (B, T, 1, D)
    sin = W[2][pos][:, :, None, :].to(x.dtype)
    for i in range(len(ks)):
        w_in, w_qkv, w_o, w_post, w_gu, w_down = W[3 + 6 * i : 9 + 6 * i]
        q, k, v = F.linear(_rms(x, w_in, eps), w_qkv).split([H * D, Hkv * D, Hkv * D], dim=-1)  # (B, T, (H + 2 Hkv) D) -> 3 parts
        q = q.reshape(B, T, H, D)
        k = k.reshape(B, T, Hkv, D)
        v = v.reshape(B, T, Hkv, D)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        ks[i].index_put_((rows, pos), k)  # (B, T, Hkv, D) into (B, T_max, Hkv, D)
        vs[i].index_put_((rows, pos), v)
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2), ks[i][:, :tk].transpose(1, 2), vs[i][:, :tk].transpose(1, 2), attn_mask=mask,
            enable_gqa=H != Hkv,
        )  # (B, H, T, D)
        x = x + F.linear(o.transpose(1, 2).reshape(B, T, H * D), w_o)
        gate, up = F.linear(_rms(x, w_post, eps), w_gu).chunk(2, dim=-1)  # (B, T, 2I) -> 2 x (B, T, I)
        x = x + F.linear(F.silu(gate) * up, w_down)
    return F.linear(_rms(x, W[-2], eps), W[-1]).float()
