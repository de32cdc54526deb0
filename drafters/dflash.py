"""``dflash``: a one-pass block drafter. One forward of a small head on the target's hidden states
proposes all k draft tokens (DFlash, "Block Diffusion for Flash Speculative Decoding", arXiv
2602.06036, z-lab/dflash; vLLM's ``method: dflash``), where ``mtp``/``eagle3`` run k chain steps.

The head (:class:`DFlashNet`): the target's hidden states of ``eagle_aux_hidden_state_layer_ids``
fused as eagle3 does (fc(low ‖ mid ‖ high), RMSNorm) give one feature per verified position; that
feature enters the draft layer as keys and values only (the *context*, DFlash's KV injection). A
block of ``dflash_block_size`` = b query slots sits at positions L-1 .. L+b-2 of a row of length L:
slot 0 is the last emitted token's embedding (its hidden state is not known yet), slots 1..b-1 a
learned mask embedding; the slots attend to every context position (<= L-2) and to each other
(bidirectional), and slot i's output predicts the token at its own position, draft i. One decoder
layer of the target's shape in Qwen3's form (per-head q/k RMSNorm before RoPE, on the context's keys
too: the layer of vLLM's ``DFlashDraftModel``, so a head exports as is), final norm, a reduced draft
vocabulary (``draft_vocab_size``, eagle3's ``d2t``) and the target's embedding by reference.

Exactness: draft i is sampled from q_i, which depends on the context and not on drafts < i, so q_i is
also its distribution given them and the rejection sampler (docs/design.md §4) stays exact with the
per-position q (B, k, V). The head always runs its trained b slots and the first k are used, so q_i
does not change with k (adaptive k included).

State between steps is the context's keys/values only (one single-layer cache, managed exactly as
``drafters.chain``'s: lazy prompt prefill with prefix sharing, plain steps held and flushed, rows
selected and admitted); a verification's columns write their keys/values, and the next block
overwrites the positions past the verified length before reading them (its span starts at L-1).

Training (:func:`dflash_loss`, after SpecForge's DFlash trainer): random anchors a per sequence, each
a block [token a, mask × (b-1)] at positions a..a+b-1 reading the context < a; slot i is trained with a
soft cross-entropy against the target's distribution of token a+i, weighted ``ttt_decay``**(i-1).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from drafters.chain import ChainDrafter, ChainNet
from drafters.eagle3 import aux_layer_ids, draft_vocab
from drafters.mtp import _load, _save
from drafters.registry import register
from drafters.targets import DraftBatch, extend_time, soft_ce, target_argmax, target_distribution, temper
from workbench.rollout.drafter import DraftContext, DrafterTarget, DraftProposal
from workbench.rollout.layers import RMSNorm, apply_rope, cache_kv, decoder_layer, rms_norm, rope_cos_sin
from workbench.rollout.model import LMConfig
from workbench.rollout.sampling import probs_from_logits

ANCHORS = 16  # training blocks per sequence (SpecForge samples up to 512 on long sequences)


class DFlashNet(ChainNet):
    """The dflash head: fuse, context keys/values, one bidirectional block layer, the draft-vocabulary head."""

    def __init__(self, cfg: LMConfig, layer_ids: tuple[int, ...], d2t: torch.Tensor, t2d: torch.Tensor):
        super().__init__(cfg, cfg.hidden_size, 1, qk_norm=True)
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer_ids = tuple(layer_ids)
        self.fc = nn.Linear(len(layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)  # the fused context feature
        self.input_layernorm = RMSNorm(H, eps)  # the block's slots
        self.norm = RMSNorm(H, eps)
        self.lm_head = nn.Linear(H, d2t.shape[0], bias=False)
        self.mask_embedding = nn.Parameter(torch.zeros(H))  # slots 1..b-1 (set from the target's embedding)
        self.register_buffer("d2t", d2t.clone())
        self.register_buffer("t2d", t2d.clone())

    def fuse(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """{layer: (B, T, H)} -> the context feature (B, T, H)."""
        return self.hidden_norm(self.fc(torch.cat([hidden[i] for i in self.layer_ids], -1)))

    def ctx_kv(self, feat: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Context keys (k-normed, then RoPE at ``pos`` (B, T)) and values (B, T, Hkv, D) of features
        (B, T, H): the layer's k/v projections only (the context never runs through the layer)."""
        a, D = self.attn[0], self.rope_cos.shape[-1]
        B, T, _ = feat.shape
        k = F.linear(feat, a.k_proj.weight).reshape(B, T, -1, D)  # (B, T, Hkv, D)
        k = rms_norm(k, a.k_norm.weight, a.k_norm.eps)  # per head, as the block's own keys
        v = F.linear(feat, a.v_proj.weight).reshape(B, T, -1, D)
        cos, sin = rope_cos_sin(self.rope_cos, self.rope_sin, pos, feat.dtype)  # (B, T, 1, D)
        return apply_rope(k, cos, sin), v

    def slots(self, first: torch.Tensor, b: int) -> torch.Tensor:
        """The block's input (B, b, H): the embedding of ``first`` (B,) then b-1 mask embeddings."""
        e = self.embed(first[:, None])  # (B, 1, H)
        return torch.cat([e, self.mask_embedding.to(e.dtype).expand(e.shape[0], b - 1, -1)], 1)

    def run_block(self, x: torch.Tensor, pos: torch.Tensor, kv_fn) -> torch.Tensor:
        """The draft layer over slots x (B, Q, H) at positions ``pos`` (B, Q); ``kv_fn`` stores the slots'
        keys/values and returns the context's and theirs under the block mask -> outputs (B, Q, H)."""
        a, f, post = self.attn[0], self.mlp[0], self.post_attention_layernorm[0]
        cos, sin = rope_cos_sin(self.rope_cos, self.rope_sin, pos, x.dtype)
        return decoder_layer(
            self.input_layernorm(x),
            x,
            a.qkv_weight(),
            a.o_proj.weight,
            post.weight,
            f.gate_up_weight(),
            f.down_proj.weight,
            post.eps,
            cos,
            sin,
            kv_fn,
            qk_norm=a.qk_norm_weight(),
        )

    def logits(self, m: int, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out)).float()  # (..., Vd) draft vocabulary


@register
class DFlashDrafter(ChainDrafter):
    kind = "dflash"
    arch_fields = ("eagle_aux_hidden_state_layer_ids", "draft_vocab_size", "dflash_block_size", "ttt_decay")
    vllm_weights = True  # exported as vLLM's DFlashDraftModel (drafters/dflash_vllm.py), reloaded when adapted
    vllm_head_folder = True
    reduced_draft_vocab = True
    LAYER = "qwen3"  # the draft layer's form (q/k norm), in the checkpoint and the init cache key

    def vllm_state(self) -> list[tuple[str, torch.Tensor]]:
        """The head's weights under vLLM's ``DFlashDraftModel`` names."""
        from drafters.dflash_vllm import to_vllm_state

        return list(to_vllm_state({n: t.detach() for n, t in self.net.state_dict().items()}).items())

    @classmethod
    def arch_key(cls, spec) -> dict:
        """:meth:`Drafter.arch_key` plus the layer's form: heads made before the q/k norm get another key."""
        return super().arch_key(spec) | {"layer": cls.LAYER}

    @classmethod
    def vllm_serving_notes(cls, spec) -> list[str]:
        """vLLM's DFlash proposes one whole block: k is fixed by the head."""
        return [f"dflash: k={spec.k} = dflash_block_size - 1, the block the head was trained on"]

    @classmethod
    def draft_forwards(cls, k: int) -> tuple[tuple[int, int], ...]:
        """One forward over the whole block of k + 1 slots (vLLM's ``DFlashProposer``; ours runs
        ``dflash_block_size`` = k + 1 slots when served by vLLM)."""
        return ((k + 1, 1),) if k > 0 else ()

    @classmethod
    def vllm_speculative_config(cls, spec, draft_folder, draft_sample_method=None, require_installed=True) -> dict:
        """vLLM's dflash method on the head folder :meth:`vllm_folder` exported.

        Raises:
            ValueError: online adaptation (vLLM 0.32 cannot reload a DFlash head in place), or k other
                than ``dflash_block_size - 1``; each names the field.
        """
        # vLLM's block is k + 1 slots; ours is always the trained dflash_block_size (two-way attention: the
        # block's length shapes every q_i), so the two propose alike only at k = dflash_block_size - 1
        if spec.online.enabled:
            raise ValueError(
                "drafter.online.enabled=true with drafter.kind=dflash and rollout.backend=vllm: vLLM 0.32 cannot "
                "reload a DFlash head in place (its fused context projection is built once, at load); set "
                "drafter.online.enabled=false, or rollout.backend=workbench"
            )
        k, block = spec.k, spec.dflash_block_size
        if k != block - 1:
            raise ValueError(
                f"drafter.k={k} with drafter.kind=dflash and rollout.backend=vllm: vLLM runs a block of k + 1 slots "
                f"and the head was trained on drafter.dflash_block_size={block}; set "
                f"drafter.k={block - 1} or drafter.dflash_block_size={k + 1}"
            )
        return {"method": "dflash", "model": draft_folder, "num_speculative_tokens": k}

    @classmethod
    def vllm_folder(cls, spec, drafter, init_path, target_cfg, work, stop_ids=()) -> str:
        """The run's head exported as vLLM's ``DFlashDraftModel`` into ``work / "dflash"`` (``stop_ids``: ids
        its mask token must not be)."""
        from drafters.dflash_vllm import export_dflash

        return str(export_dflash(drafter.net, target_cfg, work / "dflash", drafter.block_size, stop_ids))

    def __init__(self, net: DFlashNet, hidden_layers, vocab_size: int, block_size: int, decay: float):
        super().__init__(net, hidden_layers, vocab_size, ttt_steps=1, ttt_decay=decay)
        self.block_size = block_size
        self.forwards = 0  # draft forwards run by propose (one per verification step)

    @classmethod
    def from_spec(cls, spec, target: DrafterTarget, device=None) -> "DFlashDrafter":
        """Fresh (random layer, head rows copied from the target's LM head, mask embedding = the mean
        token embedding) or ``target.init_path``'s checkpoint (``wb drafter init``).

        Raises:
            ValueError: layer ids beyond the target's depth, a bad draft_vocab_size, k >= dflash_block_size,
                or a checkpoint made for another target.
        """
        lm = target.lm
        cfg, V = lm.cfg, lm.cfg.vocab_size
        if spec.k > spec.dflash_block_size - 1:
            raise ValueError(
                f"drafter.k: {spec.k} drafts need a block of at least k+1 slots; drafter.dflash_block_size is "
                f"{spec.dflash_block_size} (set drafter.dflash_block_size={spec.k + 1} or more)"
            )
        ids = aux_layer_ids(spec, cfg.num_layers)
        d2t, t2d = draft_vocab(spec, target)
        net = DFlashNet(cfg, ids, d2t, t2d)
        path = target.init_path
        expect = {"hidden_size": cfg.hidden_size, "vocab_size": V, "layer_ids": list(ids), "layer": cls.LAYER}
        if path is not None:
            _load(net, Path(path), "dflash", expect | {"block_size": spec.dflash_block_size})
        else:
            with torch.no_grad():
                net.lm_head.weight.copy_(lm.lm_head.weight[d2t].float())
                net.mask_embedding.copy_(lm.model.embed_tokens.weight.float().mean(0))
        w = lm.lm_head.weight
        net.to(device=w.device, dtype=w.dtype)
        net.share(lm.model.embed_tokens, lm.lm_head)
        return cls(net, ids, V, spec.dflash_block_size, spec.ttt_decay)

    def save(self, folder) -> None:
        n = self.net
        config = {"kind": "dflash", "hidden_size": n.cfg.hidden_size, "vocab_size": self.vocab_size}
        config |= {
            "layer_ids": list(n.layer_ids),
            "draft_vocab_size": int(n.d2t.shape[0]),
            "block_size": self.block_size,
            "layer": self.LAYER,
        }
        _save(n, Path(folder), config)

    # -- the context: keys/values written where the chain writes its real entries
    @torch.no_grad()
    def _feed_real(self, feat, toks, pos, col, tk=None) -> None:
        """Context keys/values of features ``feat`` (B, T, H) at ``pos`` (B, T) (``toks``: unused, the
        context reads no token); ``last_out`` keeps the feature at ``col`` for the chain's bookkeeping."""
        k, v = self.net.ctx_kv(feat, pos)
        rows = torch.arange(pos.shape[0], device=pos.device)[:, None].expand_as(pos)
        self.cache.k[0].index_put_((rows, pos), k)
        self.cache.v[0].index_put_((rows, pos), v)
        self.last_out = feat[torch.arange(feat.shape[0], device=feat.device), col]  # (B, H)

    def _prompt_entries(self, ctx: DraftContext, hidden, n_old: int) -> dict:
        z = super()._prompt_entries(ctx, hidden, n_old)
        z["t_max"] += self.block_size  # the block reaches b-1 positions past the row's length
        return z

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        """k drafts per row from ONE forward of the block (B, b) at positions L-1 .. L+b-2."""
        assert self.cache is not None or self._lazy is not None, "start() must run before propose()"
        self._flush(ctx, None if ctx.max_len is None else ctx.max_len - 1)
        self._len_at_propose = ctx.max_len
        b, L = self.block_size, ctx.lens
        B = L.shape[0]
        pos = (L - 1)[:, None] + torch.arange(b, device=L.device)  # (B, b)
        tk = int(pos.max()) + 1 if ctx.max_len is None else ctx.max_len - 1 + b  # last slot + 1, host int
        keys = torch.arange(tk, device=L.device)
        mask = (keys[None, None, :] <= pos[:, -1:, None]).expand(B, b, tk)[:, None]  # (B, 1, b, tk): context + block
        rows = torch.arange(B, device=L.device)[:, None].expand(B, b)
        first = ctx.tokens.gather(1, (L - 1)[:, None])[:, 0]  # (B,) the last emitted token
        out = self.net.run_block(
            self.net.slots(first, b), pos, cache_kv(self.cache.k[0], self.cache.v[0], rows, pos, mask, tk)
        )
        self.forwards += 1
        logits = self.net.logits(0, out[:, 1 : k + 1])  # (B, k, Vd)
        tokens, probs = [], []
        for i in range(k):
            q_d = probs_from_logits(logits[:, i], ctx.sampling)  # (B, Vd)
            q, d = self._to_target(q_d, ctx.draw(q_d, i, self.d2t))
            tokens.append(d)
            probs.append(q)
        num = torch.full((B,), k, dtype=torch.long, device=L.device)
        return DraftProposal(torch.stack(tokens, 1), num, torch.stack(probs, 1))

    def draft_loss(self, batch: DraftBatch) -> tuple[torch.Tensor, dict]:
        return dflash_loss(
            self.net,
            batch,
            self.block_size,
            self.ttt_decay,
            restrict=(self.net.d2t, self.net.t2d),
            temperature=self.distill_temperature,
        )


def dflash_loss(
    net: DFlashNet,
    batch: DraftBatch,
    b: int,
    decay: float,
    restrict=None,
    anchors: int = ANCHORS,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict]:
    """Block-drafting loss of a :class:`DFlashNet` on ``batch`` (module doc); draft and target logits
    divided by the distillation ``temperature`` (``drafter.distill_temperature``).

    Anchors a (N, M) are drawn per sequence among positions whose next token is learned
    (``loss_mask[a] > 0``, so slot 1 is scored), with the generator of ``torch``'s global RNG. Each
    anchor's block [token a, mask × (b-1)] sits at a..a+b-1, reads the context < a and its own slots.

    Returns:
        (scalar loss = Σ_i w_i CE_i / Σ_i w_i over scored slots, w_i = decay**(i-1); stats ``draft/loss``,
        ``draft/loss_pos_<i>`` and ``draft/top1_agreement`` of slot 1 (argmax, mapped to target ids)).
    """
    ids, lmask, tl = batch.input_ids, batch.loss_mask, batch.target_logits
    N, L = ids.shape
    dev, M = ids.device, anchors
    feat = net.fuse(batch.hidden)  # (N, L, H)
    ck, cv = net.ctx_kv(feat, torch.arange(L, device=dev)[None].expand(N, L))  # (N, L, Hkv, D)
    a = torch.multinomial(lmask.float() + 1e-6, M, replacement=True)  # (N, M) anchors
    keep = lmask.gather(1, a) > 0  # (N, M) (a row with fewer scored positions repeats or drops)
    slot = torch.arange(b, device=dev)
    pos = (a[..., None] + slot).reshape(N, M * b)  # (N, M*b) block positions
    x = net.slots(ids.gather(1, a).reshape(-1), b).reshape(N, M * b, -1)  # (N, M*b, H)
    blk = torch.arange(M, device=dev).repeat_interleave(b)  # (M*b,) block of each slot
    ctx_mask = torch.arange(L, device=dev)[None, None, :] < a.repeat_interleave(b, 1)[:, :, None]  # (N, M*b, L)
    own = (blk[:, None] == blk[None, :])[None].expand(N, -1, -1)  # (N, M*b, M*b)
    mask = torch.cat([ctx_mask, own], -1)[:, None]  # (N, 1, M*b, L+M*b)

    def kv_fn(k, v):
        return torch.cat([ck, k], 1), torch.cat([cv, v], 1), mask

    out = net.run_block(x, pos.clamp_max(net.cfg.max_position_embeddings - 1), kv_fn).reshape(N, M, b, -1)
    src = a[..., None] + slot[1:] - 1  # (N, M, b-1): the target's logits at a+i-1 predict token a+i
    w = keep[..., None] * (src < L) * lmask.gather(1, src.clamp_max(L - 1).reshape(N, -1)).reshape(src.shape)
    w = w * decay ** (slot[1:].float() - 1)  # (N, M, b-1)
    at = w > 0
    logits = net.logits(0, out[:, :, 1:][at])  # (S, Vd)
    t_logits = extend_time(tl, b)[torch.arange(N, device=dev)[:, None, None].expand_as(src)[at], src[at]]  # (S, V|K)
    probs, cols = target_distribution(temper(t_logits, temperature), *(restrict or (None, None)))
    ce = soft_ce(temper(logits, temperature), probs, cols)  # (S,)
    ws = w[at]
    loss = (ce * ws).sum() / ws.sum().clamp_min(1e-9)
    stats = {"draft/loss": float(loss.detach())}
    i_of = slot[1:].expand_as(src)[at]  # (S,) the slot of each scored row
    for i in range(1, b):
        sel = i_of == i
        if sel.any():
            stats[f"draft/loss_pos_{i}"] = float(ce[sel].mean().detach())
    first = i_of == 1
    pred = logits[first].argmax(-1)
    pred = pred if restrict is None else restrict[0][pred]
    stats["draft/top1_agreement"] = (
        float((pred == target_argmax(t_logits[first])).float().mean()) if first.any() else 0.0
    )
    return loss, stats
