"""Shared machinery of the drafters that read the target (``mtp``, ``eagle3``): a chain of draft
steps over one single-layer KV cache (trained by :mod:`drafters.ttt`). Each module is the
target's decoder layer (:func:`workbench.rollout.layers.decoder_layer`: its attention, RoPE, RMSNorm,
MLP and KV cache class) fed the module's own input, in the target's shape (heads, head_dim, RoPE
scaling) but Llama-style for every family: no q/k/v biases, no q/k norm, full attention
(:meth:`workbench.rollout.arch.LMConfig.llama_layer`; vLLM's ``llama_eagle3`` does the same).

Notation: the target's hidden state at position s predicts token s+1. A chain *entry* at position s
consumes a feature f_s and the embedding of token s+1 and outputs o_s (pre-norm), whose head
predicts token s+2. Real entries use the target's features (f_s from hidden states of verified
positions); draft step j >= 1 uses its own previous output as the feature (EAGLE, Li et al. 2024;
DeepSeek-V3 MTP recursion) and the token it just drafted.

Inference (per row b, after a verification step with new length L): entries at positions <= L-2 are
real; the entry at L-2 gives q for draft 1 (token L); draft step j writes a *draft entry* at
position L-2+j. Like the target's cache, entries beyond a row's verified length are overwritten by
the next ``accept`` before any query can read them (queries attend to positions <= their own).

Training: the training-time test, :func:`drafters.ttt.ttt_loss`.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from drafters.pending import PendingSteps
from drafters.targets import DraftBatch
from drafters.ttt import ttt_loss
from workbench.rollout.drafter import DraftContext, Drafter, DraftProposal
from workbench.rollout.kv_cache import KVCache
from workbench.rollout.layers import (
    MLP,
    Attention,
    KVFn,
    RMSNorm,
    decoder_layer,
    rope_cos_sin,
    rope_tables,
)
from workbench.rollout.model import LMConfig
from workbench.rollout.sampling import probs_from_logits


class ChainNet(nn.Module):
    """A stack of ``num_modules`` single-layer draft modules run as one chain.

    Subclasses implement ``fuse`` (target hidden states -> feature), ``layer_input`` (feature and
    token embedding -> attention input and residual for module j) and ``logits`` (module j's output
    -> draft-vocabulary logits); ``embed`` is the target's embedding, shared by reference.
    """

    def __init__(self, cfg: LMConfig, in_dim: int, num_modules: int, qk_norm: bool = False):
        super().__init__()
        # The target's shape and RoPE in a plain Llama layer: no q/k/v bias, no q/k norm, full
        # attention, whatever the target's family (vLLM's llama_eagle3 builds its EAGLE-3 layer so
        # for Qwen3 targets too; DeepSeek-V3's MTP block is the target's, a Llama-style one here).
        # ``qk_norm``: a Qwen3 layer's per-head q/k RMSNorm instead (vLLM's DFlash draft layer has it).
        cfg = dataclasses.replace(cfg.llama_layer(), qk_norm=qk_norm)
        self.cfg = cfg
        # the target's attention, q/k/v reading in_dim
        self.attn = nn.ModuleList(Attention(cfg, in_dim) for _ in range(num_modules))
        self.post_attention_layernorm = nn.ModuleList(
            RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) for _ in range(num_modules)
        )
        self.mlp = nn.ModuleList(MLP(cfg) for _ in range(num_modules))
        self._shared: dict[str, nn.Module] = {}  # target modules by reference: not parameters of the drafter
        cos, sin = rope_tables(cfg, "cpu")  # (P, D) the target's RoPE: the chain uses the target's positions
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def num_modules(self) -> int:
        return len(self.attn)

    def share(self, embed: nn.Module, lm_head: nn.Module) -> None:
        """Point at the target's embedding and LM head (kept current by the `prepare` weight sync)."""
        self._shared = {"embed": embed, "lm_head": lm_head}

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._shared["embed"](tokens)

    # -- per kind
    def fuse(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def layer_input(self, j: int, feat: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def logits(self, j: int, out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- shared
    def head(self, j: int, out: torch.Tensor) -> torch.Tensor:
        """Logits of draft step j (module min(j, D-1)) from its output (B, T, H) -> (B, T, Vd)."""
        return self.logits(min(j, self.num_modules - 1), out)

    def block(self, j: int, feat: torch.Tensor, emb: torch.Tensor, pos: torch.Tensor, kv_fn: KVFn) -> torch.Tensor:
        """One module-j pass, the target's decoder layer on the module's own input: feat, emb
        (B, T, H) at positions ``pos`` (B, T) long -> the pre-norm output (B, T, H). ``kv_fn``
        stores the new keys/values and returns what to attend to (:data:`workbench.rollout.layers.KVFn`)."""
        m = min(j, self.num_modules - 1)
        attn_in, resid = self.layer_input(m, feat, emb)
        cos, sin = rope_cos_sin(self.rope_cos, self.rope_sin, pos, attn_in.dtype)  # (B, T, 1, D)
        a, f, norm = self.attn[m], self.mlp[m], self.post_attention_layernorm[m]
        return decoder_layer(
            attn_in,
            resid,
            a.qkv_weight(),
            a.o_proj.weight,
            norm.weight,
            f.gate_up_weight(),
            f.down_proj.weight,
            norm.eps,
            cos,
            sin,
            kv_fn,
        )


MAX_PENDING = 1024  # plain steps whose chain entries may wait for the next propose ...
MAX_PENDING_BYTES = 256 << 20  # ... and the memory their hidden states may hold


class ChainDrafter(Drafter):
    """Drafter over a :class:`ChainNet` (``mtp``, ``eagle3``): reads the target's hidden states.

    ``d2t`` (Vd,) maps draft-vocabulary ids to target ids (None = same vocabulary); proposals
    return q over the *target* vocabulary (zero outside the draft vocabulary) so the rejection
    sampler stays exact (docs/design.md §4).
    """

    trainable = True
    draft_cost = "head"

    @classmethod
    def draft_forwards(cls, k: int) -> tuple[tuple[int, int], ...]:
        """vLLM's proposer's first pass runs over every position the target just verified (k + 1 per row:
        it needs the draft layer's KV and hidden state at each), then k - 1 passes of one token per row
        (``SpecDecodeBaseProposer.propose``, vllm/v1/spec_decode)."""
        return ((k + 1, 1), (1, k - 1)) if k > 0 else ()

    def __init__(
        self, net: ChainNet, hidden_layers: tuple[int, ...], vocab_size: int, ttt_steps: int = 7, ttt_decay: float = 0.8
    ):
        self.net = net
        self.hidden_layers = tuple(sorted(set(hidden_layers)))
        self.vocab_size = vocab_size
        self.ttt_steps, self.ttt_decay = ttt_steps, ttt_decay
        self.cache: KVCache | None = None  # one layer, shared by the modules: (B, T_max, Hkv, D) per row and position
        self.last_out: torch.Tensor | None = None  # (B, H) output of each row's last real entry
        self._len_at_propose: int | None = None  # max(lens) at this step's propose (host), for accept
        # plain steps' entries (k_t = 0: adaptive speculation), written at the next propose in one
        # forward (or once MAX_PENDING / MAX_PENDING_BYTES is reached): per step the hidden states
        # {"h": (B, 1, L*H)}, the hidden states of the L layers it reads, concatenated
        self._pending = PendingSteps(MAX_PENDING, MAX_PENDING_BYTES)
        self._lazy: dict | None = None  # the prompts' entries until the first propose (see start)
        self.net.requires_grad_(False)

    @property
    def d2t(self) -> torch.Tensor | None:
        return getattr(self.net, "d2t", None)

    def _to_target(self, q_d: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft-vocab q (B, Vd) and ids (B,) -> q over the target vocab (B, V) and target ids."""
        if self.d2t is None:
            return q_d, d
        q = q_d.new_zeros(q_d.shape[0], self.vocab_size)
        q.scatter_(1, self.d2t[None, :].expand(q_d.shape[0], -1), q_d)
        return q, self.d2t[d]

    @torch.no_grad()
    def _feed_real(
        self, feat: torch.Tensor, toks: torch.Tensor, pos: torch.Tensor, col: torch.Tensor, tk: int | None = None
    ) -> None:
        """Write real entries (B, T) at ``pos`` and keep the output at column ``col`` (B,); ``tk``:
        max(pos) + 1 if known on the host (else read off the device)."""
        out = self.net.block(0, feat, self.net.embed(toks), pos, self.cache.kv_fn(0, pos, tk))  # (B, T, H)
        self.last_out = out[torch.arange(out.shape[0], device=out.device), col]  # (B, H)

    def start(self, ctx: DraftContext, hidden: dict[int, torch.Tensor]) -> None:
        """Keep what the prompts' entries are made of; they are written at the first ``propose``
        (lazy: a batch that adaptive speculation decodes plainly to the end never runs the chain)."""
        self.cache, self.last_out = None, None
        self._pending.clear()
        self._lazy = self._prompt_entries(ctx, hidden, 0)

    def _prompt_entries(self, ctx: DraftContext, hidden: dict[int, torch.Tensor], n_old: int) -> dict:
        """What the prompts' entries of rows ``n_old..`` are made of (their distinct prompts:
        ``ctx.distinct_prompts()``, hidden {layer: (U, P, H)})."""
        rows, index = ctx.distinct_prompts()  # (U,), (B - n_old,)
        plens = ctx.prompt_lens[n_old:]
        P = int(plens.max())
        return {
            "feat": self.net.fuse({i: h[:, :P] for i, h in hidden.items()}),  # (U, P, H)
            "toks": ctx.tokens[rows, 1 : P + 1].clone(),  # (U, P): entry s reads token s+1
            "last_u": ctx.prompt_lens[rows] - 1,  # (U,)
            "t_max": ctx.tokens.shape[1],
            # per row of the batch (follow ``select``): its distinct prompt, its prompt's last
            # position and its own first sampled token
            "index": index,
            "col": plens - 1,
            "first": ctx.tokens[n_old:].gather(1, plens[:, None]),
        }

    def admit(self, ctx: DraftContext, hidden: dict[int, torch.Tensor], n_old: int) -> None:
        """New rows' prompt entries: merged into the lazy ones if the chain has not run yet, else
        written now into the rows after the batch's (the batch's held plain steps written first)."""
        z = self._prompt_entries(ctx, hidden, n_old)
        if self._pending and n_old:  # held plain steps are in the old rows' row space: write them first
            old = DraftContext(
                ctx.tokens[:n_old],
                ctx.lens[:n_old],
                ctx.prompt_lens[:n_old],
                ctx.group_ids[:n_old],
                ctx.sampling,
                ctx.generator,
            )
            self._flush(old, None)  # (runs the lazy prefill of the old rows first)
        self._pending.clear()
        if self._lazy is not None:
            self._lazy = _merge_entries(self._lazy, z)
            return
        cache, last_out = self.cache, self.last_out
        self._prefill_entries(z)  # sets self.cache / last_out to the new rows'
        cache.append(self.cache)
        self.cache, self.last_out = cache, torch.cat([last_out, self.last_out])

    def _prefill(self) -> None:
        """The lazy prompts' entries (:meth:`_prefill_entries`)."""
        z, self._lazy = self._lazy, None
        self._prefill_entries(z)

    def _prefill_entries(self, z: dict) -> None:
        """Write the distinct prompts' entries once (prefix sharing: entries < prompt_len-1 depend
        on the prompt alone), copy them to the rows sharing each prompt, then rewrite each row's
        entry at prompt_len-1, which reads its own first sampled token."""
        U, P = z["toks"].shape
        w = next(self.net.parameters())
        index, col = z["index"], z["col"]  # (B,), (B,)
        # capacity B: the expansion to the batch's rows below, and every retirement after it, stay
        # in these buffers (KVCache.select compacts in place)
        self.cache = KVCache(
            self.net.cfg, U, z["t_max"], w.device, w.dtype, num_layers=1, capacity=max(U, index.shape[0])
        )
        pos = torch.arange(P, device=w.device)[None, :].expand(U, P)  # (U, P)
        # tk = P: the prompts' positions are < P, known on the host (no device read in a step)
        self._feed_real(z["feat"], z["toks"], pos, z["last_u"], P)
        self.cache.select(index)
        last_feat = z["feat"][index, col][:, None]  # (B, 1, H)
        self._feed_real(last_feat, z["first"], col[:, None], torch.zeros_like(col), P)

    def accept(self, ctx: DraftContext, num_emitted: torch.Tensor, hidden: dict[int, torch.Tensor]) -> None:
        """Write the verified positions' real entries. The verification fed positions
        start..start+k, start = ctx.lens - num_emitted - 1 (the length before the step, minus 1);
        the entries at start..ctx.lens-2 are real (their next token was emitted); the one at
        ctx.lens-2 (column num_emitted-1) feeds draft 1 of the next step. Entries past it read
        rejected drafts: never attended to, overwritten by the next step (see module doc)."""
        if self._len_at_propose is None:  # a plain step (k_t = 0): its entry waits for the next propose
            # (why: a policy that decodes plainly should not pay a drafter forward per step, and rows
            # that finish before the drafter is asked again never pay for theirs). Only the hidden
            # states are held, in one tensor: positions and tokens follow from the lengths at the flush.
            if self._pending.add({"h": torch.cat([hidden[i] for i in self.hidden_layers], -1)}):  # (B, 1, L*H)
                self._flush(ctx, None)  # (max(pos) read off the device: every row may have finished this step)
            return
        T = next(iter(hidden.values())).shape[1]  # k + 1
        start = ctx.lens - num_emitted - 1  # (B,) position of the verification's column 0
        pos = start[:, None] + torch.arange(T, device=start.device)  # (B, k+1)
        toks = ctx.tokens.gather(1, pos + 1)  # (B, k+1) token s+1 of entry s
        # max(pos) + 1 = the longest row before the step - 1 + T, known on the host since propose
        before, self._len_at_propose = self._len_at_propose, None
        self._feed_real(self.net.fuse(hidden), toks, pos, num_emitted - 1, None if before is None else before - 1 + T)

    def _flush(self, ctx: DraftContext, tk: int | None) -> None:
        """Write the m held plain steps' entries in one forward; ``tk``: max(pos) + 1 if known on the
        host. Each plain step emitted one token per live row, so with L = ctx.lens the held entries
        sit at positions L-1-m .. L-2 and read the tokens after them (a finished row riding along
        in a batch-size bucket emitted none: its entries land lower, clamped at 0; never read)."""
        if self._lazy is not None:
            self._prefill()
        if not self._pending:
            return
        h = self._pending.take()["h"]  # (B, m, L*H)
        m, H = h.shape[1], h.shape[2] // len(self.hidden_layers)
        hidden = dict(zip(self.hidden_layers, h.split(H, -1)))  # {layer: (B, m, H)}
        pos = ((ctx.lens - 1 - m)[:, None] + torch.arange(m, device=h.device)).clamp_min(0)  # (B, m)
        toks = ctx.tokens.gather(1, pos + 1)  # (B, m) token s+1 of entry s
        last = torch.full((toks.shape[0],), m - 1, dtype=torch.long, device=toks.device)
        self._feed_real(self.net.fuse(hidden), toks, pos, last, tk)

    @torch.no_grad()
    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        assert self.cache is not None or self._lazy is not None, "start() must run before propose()"
        self._flush(ctx, None if ctx.max_len is None else ctx.max_len - 1)  # the last plain entry sits at lens - 2
        self._len_at_propose = ctx.max_len  # for accept's attention span (None: read it there)
        o = self.last_out
        logits = self.net.head(0, o)  # (B, Vd)
        tokens, probs = [], []
        for j in range(k):
            q_d = probs_from_logits(logits, ctx.sampling)  # (B, Vd)
            q, d = self._to_target(q_d, ctx.draw(q_d, j, self.d2t))
            tokens.append(d)
            probs.append(q)
            if j < k - 1:  # draft step j+1: entry at L-1+j, feature = own output, token = draft j
                pos = (ctx.lens - 1 + j)[:, None]  # (B, 1)
                tk = None if ctx.max_len is None else ctx.max_len + j  # max(pos) + 1 without a device read
                o = self.net.block(j + 1, o[:, None], self.net.embed(d[:, None]), pos, self.cache.kv_fn(0, pos, tk))[
                    :, 0
                ]
                logits = self.net.head(j + 1, o)
        num = torch.full((o.shape[0],), k, dtype=torch.long, device=o.device)
        return DraftProposal(torch.stack(tokens, 1), num, torch.stack(probs, 1))

    def select(self, rows: torch.Tensor, moved: torch.Tensor | None = None) -> None:
        if self._lazy is not None:  # not prefilled yet: the remaining rows keep their prompts' entries
            for key in ("index", "col", "first"):
                self._lazy[key] = self._lazy[key].index_select(0, rows)
        if self.cache is not None:
            self.cache.select(rows, moved)
            self.last_out = self.last_out.index_select(0, rows)
        self._pending.select(rows)

    # -- training (drafter init and online adaptation)
    def train_parameters(self) -> list[nn.Parameter]:
        return list(self.net.parameters())

    def draft_loss(self, batch: DraftBatch) -> tuple[torch.Tensor, dict]:
        restrict = None if self.d2t is None else (self.d2t, self.net.t2d)
        return ttt_loss(
            self.net, batch, self.ttt_steps, self.ttt_decay, restrict=restrict, temperature=self.distill_temperature
        )


def _merge_entries(a: dict, b: dict) -> dict:
    """Two sets of lazy prompt entries (:meth:`ChainDrafter._prompt_entries`) as one: b's distinct
    prompts after a's (right-padded to the longer), b's rows after a's."""
    P = max(a["toks"].shape[1], b["toks"].shape[1])

    def pad(t):  # (U, p, ...) -> (U, P, ...)
        return F.pad(t, (0, 0) * (t.dim() - 2) + (0, P - t.shape[1]))

    return {
        "feat": torch.cat([pad(a["feat"]), pad(b["feat"])]),
        "toks": torch.cat([pad(a["toks"]), pad(b["toks"])]),
        "last_u": torch.cat([a["last_u"], b["last_u"]]),
        "t_max": a["t_max"],
        "index": torch.cat([a["index"], b["index"] + a["toks"].shape[0]]),
        "col": torch.cat([a["col"], b["col"]]),
        "first": torch.cat([a["first"], b["first"]]),
    }
