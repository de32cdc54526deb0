"""Function-preserving growth of a Llama checkpoint (Net2Net: Chen et al. 2016, arXiv 1511.05641).

    big = LlamaForCausalLM(make_config(get_preset("membound"), tok))
    info = grow_into(big, tiny, jitter=0.1, seed=0)    # big computes tiny's logits (float tolerance)

Wider: every residual channel, attention head (whole heads: head_dim and RoPE stay), key/value
head and MLP unit of the source becomes ``m`` copies; a layer that *reads* copies gets its
incoming weight split among them, W[:, u] -> W[:, u]·r_c with Σ_c r_c = 1, so it computes what the
source computed. Deeper: each source layer is followed by ``d − 1`` identity blocks (a copy of it
with o_proj and down_proj zeroed: the block adds nothing to the residual until trained).

Why it preserves the function, piece by piece:
- residual stream: channel i -> channels i·m .. i·m+m−1, all equal to it; RMSNorm's mean of x² over
  the channels is the same over exact copies, so every norm's output is the copies of the source's;
- tied embeddings: the embedding (a writer) is copied column by column; its tied use as the LM head
  (a reader) is split through the final norm's weight (g_i -> g_i·r_{i,c});
- attention: q/k/v heads copied whole (head j of the grown model is a copy of source head j // m, and
  key/value head j' of source head j' // m, so grouped-query attention pairs the same heads); the
  scores (q·k over head_dim) are the source's; o_proj reads head copies (split) and writes
  residual copies (copied);
- MLP: gate/up read residual copies (split) and write unit copies; down_proj reads unit copies
  (split) and writes residual copies.

Symmetry: copies with identical weights receive identical gradients and would never differ (the
grown model would keep the source's capacity). Here rows are copied first and each split fraction is
then drawn per weight entry, r = (1 + jitter·(z − mean_c z)) / m with z ~ N(0, 1), so copies'
weights differ from the start while the function is still the source's exactly (Σ_c r = 1 and the
copies' inputs are equal): their gradients differ, and continued training separates them.
``jitter=0`` splits evenly.
"""

from __future__ import annotations

import torch
from torch import nn


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def growth_factors(src_cfg, dst_cfg) -> tuple[int, int, int]:
    """(m width factor, m_i intermediate factor, d depth factor) from two Llama configs.

    Raises ValueError unless the grown config is the source's with hidden size, heads and key/value
    heads times the same integer m (head_dim unchanged), intermediate size times an integer m_i,
    layers times an integer d, and the same vocabulary, RoPE and norm settings.
    """
    m, r = divmod(dst_cfg.hidden_size, src_cfg.hidden_size)
    mi, ri = divmod(dst_cfg.intermediate_size, src_cfg.intermediate_size)
    d, rd = divmod(dst_cfg.num_hidden_layers, src_cfg.num_hidden_layers)
    problems = []
    if r or m < 1:
        problems.append(f"hidden_size {dst_cfg.hidden_size} is not a multiple of {src_cfg.hidden_size}")
    if ri or mi < 1:
        problems.append(
            f"intermediate_size {dst_cfg.intermediate_size} is not a multiple of {src_cfg.intermediate_size}"
        )
    if rd or d < 1:
        problems.append(
            f"num_hidden_layers {dst_cfg.num_hidden_layers} is not a multiple of {src_cfg.num_hidden_layers}"
        )
    if (
        dst_cfg.num_attention_heads != m * src_cfg.num_attention_heads
        or dst_cfg.num_key_value_heads != m * src_cfg.num_key_value_heads
    ):
        problems.append(
            f"heads {dst_cfg.num_attention_heads}/{dst_cfg.num_key_value_heads} are not {m} x the source's "
            f"{src_cfg.num_attention_heads}/{src_cfg.num_key_value_heads}"
        )
    if _head_dim(dst_cfg) != _head_dim(src_cfg):
        problems.append(f"head_dim {_head_dim(dst_cfg)} differs from the source's {_head_dim(src_cfg)}")
    for f in (
        "vocab_size",
        "tie_word_embeddings",
        "rope_theta",
        "rms_norm_eps",
        "hidden_act",
        "attention_bias",
        "mlp_bias",
    ):
        if getattr(dst_cfg, f, None) != getattr(src_cfg, f, None):
            problems.append(
                f"{f} {getattr(dst_cfg, f, None)!r} differs from the source's {getattr(src_cfg, f, None)!r}"
            )
    if problems:
        raise ValueError("cannot grow: " + "; ".join(problems))
    return m, mi, d


class _Splitter:
    """Split fractions r (summing to 1 over the m copies) for the incoming weights of copied units."""

    def __init__(self, jitter: float, seed: int):
        self.jitter = jitter
        self.gen = torch.Generator().manual_seed(seed)

    def fractions(self, shape: tuple[int, ...], m: int) -> torch.Tensor:
        """(*shape, m) float64 fractions, each (*shape) slice summing to 1 over the last axis."""
        if m == 1 or self.jitter == 0:
            return torch.full((*shape, m), 1.0 / m, dtype=torch.float64)
        z = torch.randn((*shape, m), generator=self.gen, dtype=torch.float64)
        return (1 + self.jitter * (z - z.mean(-1, keepdim=True))) / m


def _copy_out(w: torch.Tensor, m: int, group: int) -> torch.Tensor:
    """Rows of w (out, ...) in units of ``group`` rows, each unit repeated m times in place."""
    out = w.shape[0] // group
    return w.reshape(out, group, *w.shape[1:]).repeat_interleave(m, 0).reshape(out * group * m, *w.shape[1:])


def _split_in(w: torch.Tensor, m: int, group: int, split: _Splitter) -> torch.Tensor:
    """Columns of w (rows, in) in units of ``group``, each unit repeated m times with its values split
    among the copies by fractions drawn per entry (see :class:`_Splitter`)."""
    rows, cols = w.shape
    units = cols // group
    r = split.fractions((rows, units, group), m)  # one fraction per entry of each copy
    wide = w.double().reshape(rows, units, group, 1) * r  # (rows, units, group, m)
    return wide.permute(0, 1, 3, 2).reshape(rows, units * m * group).to(w.dtype)


@torch.no_grad()
def grow_into(dst: nn.Module, src: nn.Module, jitter: float = 0.0, seed: int = 0) -> dict:
    """Overwrite ``dst``'s weights (a LlamaForCausalLM of the grown config) with ``src`` grown into it.

    After this, dst's logits equal src's on any input to float tolerance (see the module doc).
    jitter: relative spread of the split fractions (0 = even splits; copies then stay identical
    under training). Returns {"width_factor", "intermediate_factor", "depth_factor", "identity_blocks"}.
    Raises ValueError if the configs are not a growth of one another (:func:`growth_factors`).
    """
    m, mi, d = growth_factors(src.config, dst.config)
    hd = _head_dim(src.config)
    split = _Splitter(jitter, seed)
    s = src.state_dict()
    new: dict[str, torch.Tensor] = {}
    new["model.embed_tokens.weight"] = s["model.embed_tokens.weight"].repeat_interleave(m, 1)  # writer: copied
    g = s["model.norm.weight"]  # final norm: its tied LM head reads residual copies, so split here
    new["model.norm.weight"] = (g.double().unsqueeze(-1) * split.fractions(tuple(g.shape), m)).reshape(-1).to(g.dtype)
    if not src.config.tie_word_embeddings:
        lm = s["lm_head.weight"]
        new["lm_head.weight"] = _split_in(lm, m, 1, split)
        new["model.norm.weight"] = g.repeat_interleave(m)
    identity = []
    for i in range(dst.config.num_hidden_layers):
        pre, spre = f"model.layers.{i}.", f"model.layers.{i // d}."
        w = lambda n: s[spre + n]  # noqa: E731
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            new[pre + n] = w(n).repeat_interleave(m)  # per-channel scales of residual copies
        for n in ("q_proj", "k_proj", "v_proj"):  # read residual copies, write head copies
            new[pre + f"self_attn.{n}.weight"] = _split_in(_copy_out(w(f"self_attn.{n}.weight"), m, hd), m, 1, split)
        new[pre + "self_attn.o_proj.weight"] = _split_in(_copy_out(w("self_attn.o_proj.weight"), m, 1), m, hd, split)
        for n in ("gate_proj", "up_proj"):
            new[pre + f"mlp.{n}.weight"] = _split_in(_copy_out(w(f"mlp.{n}.weight"), mi, 1), m, 1, split)
        new[pre + "mlp.down_proj.weight"] = _split_in(_copy_out(w("mlp.down_proj.weight"), m, 1), mi, 1, split)
        if i % d:  # an identity block after source layer i // d: adds nothing until trained
            new[pre + "self_attn.o_proj.weight"].zero_()
            new[pre + "mlp.down_proj.weight"].zero_()
            identity.append(i)
    missing, unexpected = dst.load_state_dict(new, strict=False)
    missing = [
        k for k in missing if not (dst.config.tie_word_embeddings and k == "lm_head.weight") and "rotary" not in k
    ]
    if missing or unexpected:
        raise ValueError(f"cannot grow: weights missing {missing[:4]}, unexpected {unexpected[:4]}")
    return {"width_factor": m, "intermediate_factor": mi, "depth_factor": d, "identity_blocks": identity}
