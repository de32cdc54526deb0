"""``draft_model`` drafter: a small causal LM with the target's tokenizer and its own KV cache.

Leviathan et al. 2023 / Chen et al. 2023; vLLM ``method="draft_model"``. The draft model samples
k tokens autoregressively from q = the sampling transform of its logits, and returns q so the
rejection sampler can accept with min(1, p/q) — the probabilistic case of docs/design.md §4. Under keyed
sampling (``rollout.sampler=keyed``, :mod:`workbench.rollout.keyed`) it drafts q's argmax or its coupled draft
(Gumbel-max under the target's keyed noise; ``rollout.keyed_draft``).

KV bookkeeping without rollback: each step feeds the *last two* tokens of every row at positions
lens-2, lens-1. After a verification step that accepted n of k drafts, the draft cache holds every
accepted token except possibly the last accepted draft (when n == k) and never the correction /
bonus token; feeding two tokens covers both cases (one of them is recomputed when n < k).
Stale entries past a row's length are never read (position mask) and get overwritten. So it
needs nothing from ``accept``: every ``propose`` reads the verified tokens from its fresh context.

The prompts' prefill is lazy (at the first ``propose``); plain steps before a propose (k_t = 0,
adaptive speculation) are counted and their tokens fed with the next propose's two.
"""

from __future__ import annotations

import torch

from drafters.registry import register
from workbench.rollout.drafter import DraftContext, Drafter, DrafterTarget, DraftProposal
from workbench.rollout.kv_cache import KVCache
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import probs_from_logits


def first_layers(target: DrafterTarget, n: int, device, dtype):
    """The target's embeddings, first ``n`` decoder layers, final norm and LM head as a causal LM
    (self-speculative early exit: Draft & Verify, Zhang et al. 2023; LayerSkip, Elhoushi et al. 2024),
    read from the target's checkpoint folder with ``num_hidden_layers=n``.

    Returns (transformers model in eval mode, tokenizer).

    Raises:
        ValueError: no target folder known, or ``n`` not below the target's depth (names drafter.draft_layers).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from workbench.models.checkpoint import load_tokenizer, quiet_hf

    if target.path is None:
        raise ValueError(
            "drafter.draft_layers: the target's checkpoint folder is not known here; give drafter.model instead"
        )
    depth = target.lm.cfg.num_layers
    if not 1 <= n < depth:
        raise ValueError(f"drafter.draft_layers: {n} is not below the target's {depth} layers; use 1..{depth - 1}")
    cfg = AutoConfig.from_pretrained(str(target.path))
    cfg.num_hidden_layers = n
    if getattr(cfg, "layer_types", None):  # per-layer attention kinds (Qwen3, Mistral): the first n
        cfg.layer_types = cfg.layer_types[:n]
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report lists the layers past n as unused: that is the point
    try:
        with quiet_hf():
            hf = AutoModelForCausalLM.from_pretrained(str(target.path), config=cfg, dtype=dtype)
    finally:
        hf_logging.set_verbosity(level)
    return hf.to(device).eval(), load_tokenizer(target.path)


@register
class DraftModelDrafter(Drafter):
    kind = "draft_model"
    trainable = True
    arch_fields = ("model",)
    vllm_weights = True  # vLLM's draft_model method loads the checkpoint
    draft_cost = "model"

    @classmethod
    def draft_forwards(cls, k: int) -> tuple[tuple[int, int], ...]:
        """k autoregressive passes of one token per row."""
        return ((1, k),) if k > 0 else ()

    @classmethod
    def served_as_given(cls, spec) -> bool:
        """A draft model with no init data and no ``draft_layers`` (a truncated copy is trained first)."""
        return spec.init_data() == "none" and spec.draft_layers is None

    @classmethod
    def vllm_speculative_config(cls, spec, draft_folder, draft_sample_method=None, require_installed=True) -> dict:
        """vLLM's draft_model method on the checkpoint folder ``draft_folder``."""
        return cls._vllm_model_method(spec, draft_folder, draft_sample_method)

    @classmethod
    def vllm_folder(cls, spec, drafter, init_path, target_cfg, work, stop_ids=()) -> str:
        """The init checkpoint when trained; else the weights the workbench drafts with, saved under
        ``work``; else ``drafter.model`` resolved (a preset or a Hugging Face folder)."""
        if init_path is not None:
            return str(init_path)
        if drafter is not None and getattr(drafter, "hf", None) is not None:
            drafter.save(work / "draft_model")
            return str(work / "draft_model")
        from workbench.models import resolve_model

        return str(resolve_model(spec.model, what="drafter.model"))

    @classmethod
    def initialised_by_default(cls, spec) -> bool:
        """A given draft model drafts as it is; a truncated copy of the target (``draft_layers``) is trained first."""
        return spec.draft_layers is not None

    @classmethod
    def arch_key(cls, spec) -> dict:
        """``model``, and ``draft_layers`` when set."""
        return super().arch_key(spec) | ({"draft_layers": spec.draft_layers} if spec.draft_layers else {})

    def __init__(self, model: LeanLM, hf=None, tokenizer=None):
        self.model = model
        self.hf = hf  # trainable transformers copy (init and online distillation); proposals use ``model``
        self.tokenizer = tokenizer
        self.cache: KVCache | None = None
        self._prompts: torch.Tensor | None = None  # (U, P) distinct prompts until the lazy prefill
        self._index: torch.Tensor | None = None  # (B,) each row's distinct prompt
        self._t_max = 0
        # steps since the last propose that emitted a token without one (k_t = 0, adaptive
        # speculation): their tokens are not in the draft cache yet, the next propose feeds them
        self._missed, self._proposed = 0, False

    @classmethod
    def from_spec(cls, spec, target: DrafterTarget, device=None) -> "DraftModelDrafter":
        """Load ``spec.model`` (preset or checkpoint folder) and check it shares the target's tokenizer.

        Raises:
            ValueError: the checkpoint's tokenizer differs from the target's (names drafter.model).
        """
        from workbench.models import check_same_tokenizer, load_model, resolve_model

        init_path = target.init_path
        dtype = target.lm.lm_head.weight.dtype  # the target's (model.dtype): a bfloat16 run drafts in bfloat16 too
        if init_path is None and spec.draft_layers is not None:
            hf, tok = first_layers(target, spec.draft_layers, device, dtype)
        else:
            path = init_path or resolve_model(spec.model, what="drafter.model")
            what = "drafter.init" if init_path else "drafter.model"
            hf, tok = load_model(path, device=device, dtype=dtype, what=what)
        if target.tokenizer is not None:
            check_same_tokenizer(target.tokenizer, tok, "drafter.model")
        return cls(LeanLM.from_hf(hf, what="drafter.model"), hf, tok)

    def start(self, ctx: DraftContext, hidden: dict[int, torch.Tensor]) -> None:
        """Remember the distinct prompts; their prefill runs at the first ``propose`` (lazy: a
        batch that adaptive speculation decodes plainly to the end never pays a draft forward)."""
        rows, index = ctx.distinct_prompts()  # (U,), (B,)
        P = int(ctx.prompt_lens.max())
        self._prompts = ctx.tokens[rows, :P].clone()  # (U, P) right-padded
        self._index, self._t_max = index, ctx.tokens.shape[1]  # (B,): each row's distinct prompt
        self.cache = None
        self._missed, self._proposed = 0, False

    def admit(self, ctx: DraftContext, hidden: dict[int, torch.Tensor], n_old: int) -> None:
        """New rows' prompts: kept for the lazy prefill if it has not run yet, else prefilled now
        into the rows after the batch's (their plain steps are fed at the next ``propose``)."""
        rows, index = ctx.distinct_prompts()  # (U,) rows of the batch, (m,) each new row's prompt
        P = int(ctx.prompt_lens[n_old:].max())
        prompts = ctx.tokens[rows, :P].clone()  # (U, P) right-padded
        if self.cache is None:
            W = max(P, self._prompts.shape[1])
            pad = lambda t: torch.nn.functional.pad(t, (0, W - t.shape[1]))  # noqa: E731 (right-pad to W)
            self._index = torch.cat([self._index, index + self._prompts.shape[0]])
            self._prompts = torch.cat([pad(self._prompts), pad(prompts)])
            return
        self.cache.append(self._prefill_rows(prompts, index))

    def _prefill_rows(self, prompts: torch.Tensor, index: torch.Tensor):
        """A cache of the rows ``index`` (B,) of the distinct (U, P) right-padded ``prompts``: each
        prompt prefilled once (padding positions get overwritten before any read), its cache rows
        copied to the rows that share it."""
        U = prompts.shape[0]
        cache = self.model.new_cache(U, self._t_max, capacity=max(U, index.shape[0]))
        zeros = torch.zeros(U, dtype=torch.long, device=prompts.device)
        self.model(prompts, zeros, cache, logits_col=zeros, max_start=0)
        cache.select(index)  # (also when U == B: rows may have left since start)
        return cache

    def _prefill(self) -> None:
        """The lazy prefill of the batch's distinct prompts (:meth:`_prefill_rows`)."""
        self.cache = self._prefill_rows(self._prompts, self._index)
        self._prompts = None

    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        """k drafts per row sampled from q: tokens (B, k), q (B, k, V). Feeds tokens lens-2, lens-1
        first (plus one earlier token per step that emitted without a proposal, k_t = 0)."""
        if self.cache is None:
            assert self._prompts is not None, "start() must run before propose()"
            self._prefill()  # the plain steps before (self._missed) are fed below, from position prompt_len - 1
        B = ctx.lens.shape[0]
        T = 2 + self._missed  # the draft cache is valid below lens - T
        # clamped: finished rows riding along in a bucket, and rows admitted since the last proposal
        # whose sequence is shorter than T (a row's cache is valid below lens - 2 - its own missed
        # steps, so feeding from further back rewrites valid entries with the same values)
        start = (ctx.lens - T).clamp_min(0)  # (B,)
        cols = start[:, None] + torch.arange(T, device=start.device)  # (B, T)
        inp = ctx.tokens.gather(1, cols)  # (B, T)
        # full logits (B, T, V) rather than ``logits_col``: a plain forward takes the compiled path
        m = ctx.max_len  # max(lens) on the host (the engine's one read per step): no device read per forward
        logits = self.model(inp, start, self.cache, max_start=None if m is None else max(m - T, 0))[0]  # (B, T, V)
        last = (ctx.lens - 1 - start).clamp(0, T - 1)  # (B,) column of each row's last token (T - 1 unless clamped)
        logits = logits.gather(1, last[:, None, None].expand(-1, 1, logits.shape[-1]))  # (B, 1, V)
        self._missed, self._proposed = 0, True
        tokens, probs = [], []
        for j in range(k):
            q = probs_from_logits(logits[:, 0], ctx.sampling)  # (B, V)
            d = ctx.draw(q, j)  # (B,) sampled from q; keyed: q's argmax (or the coupled draft)
            tokens.append(d)
            probs.append(q)
            if j < k - 1:
                logits, _ = self.model(d[:, None], ctx.lens + j, self.cache, max_start=None if m is None else m + j)
        num = torch.full((B,), k, dtype=torch.long, device=start.device)
        return DraftProposal(torch.stack(tokens, 1), num, torch.stack(probs, 1))

    def accept(self, ctx: DraftContext, num_emitted: torch.Tensor, hidden: dict[int, torch.Tensor]) -> None:
        """Nothing to do after a proposal (its accepted drafts are in the cache already); after a
        plain step (k_t = 0) the emitted token is remembered for the next propose to feed."""
        if not self._proposed:
            self._missed += 1
        self._proposed = False

    def select(self, rows: torch.Tensor, moved: torch.Tensor | None = None) -> None:
        if self.cache is not None:
            self.cache.select(rows, moved)
        elif self._prompts is not None:  # not prefilled yet: the rows keep their distinct prompts
            self._index = self._index[rows]

    # -- training: forward KL(target || draft) at drafter.distill_temperature on the target's logits
    def train_parameters(self) -> list[torch.nn.Parameter]:
        return list(self.hf.parameters())

    def draft_loss(self, batch) -> tuple[torch.Tensor, dict]:
        """batch: :class:`drafters.targets.DraftBatch`; loss = mean masked KL(target || draft) (nats/token)."""
        from drafters.targets import forward_kl, target_argmax

        self.hf.train()
        logits = self.hf(input_ids=batch.input_ids).logits  # (N, L, V)
        loss = forward_kl(logits, batch.target_logits, batch.loss_mask, self.distill_temperature)
        m = batch.loss_mask
        agree = (logits.argmax(-1) == target_argmax(batch.target_logits)).float()
        top1 = float((agree * m).sum() / m.sum().clamp_min(1))
        return loss, {"draft/loss": float(loss.detach()), "draft/top1_agreement": top1}

    def after_update(self) -> None:
        self.hf.eval()
        self.model.load_weights(self.hf)

    def vllm_state(self) -> list[tuple[str, torch.Tensor]]:
        """The trainable copy's weights under their Hugging Face names (vLLM's draft_model checkpoint)."""
        return [(n, t.detach()) for n, t in self.hf.state_dict().items()]

    def save(self, folder) -> None:
        from workbench.models.checkpoint import quiet_hf

        with quiet_hf():
            self.hf.save_pretrained(str(folder))
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(folder))
