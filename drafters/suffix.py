"""``suffix`` drafter: suffix decoding over the row's own tokens, its GRPO siblings and earlier rollouts.

Suffix decoding (Oliaro et al. 2024, arXiv 2411.04975; Arctic Inference; vLLM ``method: "suffix"``
with vLLM's ``suffix_decoding_*`` options), adapted to RL rollouts (docs/design.md §9; RhymeRL/HistoSpec,
arXiv 2508.18588): each row drafts from a suffix trie of every rollout of its prompt, namely

- its own prompt + tokens generated so far,
- its siblings in the batch (rows with the same prompt: its GRPO group), each only up to the tokens
  it has generated (a token enters the trie when the engine emits it, never before),
- the prompt's earlier rollouts, kept across ``generate`` calls (GRPO steps, epochs) in a FIFO
  history of at most ``suffix_decoding_max_cached_requests`` finished rollouts.

Siblings are found by prompt token ids, not ``DraftContext.group_ids``: in GRPO the two mark the
same rows, the history is keyed by prompt anyway, and a batch of one prompt under distinct group
ids (``wb audit``: 68k rows) then shares one trie instead of building one per row with the whole
history in each.

The maths (counts, the best-scoring greedy continuation over match lengths, ``max_spec_factor``,
``min_token_prob``, the tree depth) is in :mod:`drafters.suffix_tree`; this module converts the
engine's tensors to token lists and back. Drafts are deterministic (q = one-hot, ``probs`` None),
so rejection sampling stays exact; a row may get 0..k drafts. Host cost, in Python: every step
reads the emitted tokens and records them (O(emitted tokens)); a proposal costs O(max_depth + k)
trie steps per row, after its prompt's trie has taken in the tokens recorded since (O(tokens *
max_depth)), and is first built at the prompt's first proposal of the batch (O((prompt + history
tokens) * max_depth)). A batch decoded plainly (adaptive k_t = 0) never builds a trie.
"""

from __future__ import annotations

import importlib.util

import torch

from drafters.registry import register
from drafters.suffix_tree import RolloutHistory, SuffixBatch
from workbench.rollout.drafter import DraftContext, Drafter, DrafterTarget, DraftProposal


def emitted_tokens(tokens: torch.Tensor, lens: torch.Tensor, num_emitted: torch.Tensor) -> list[list[int]]:
    """Per row, the tokens a verification step emitted: ``tokens[b, lens[b] - num_emitted[b] : lens[b]]``.

    tokens (B, T_max) long, lens (B,) long lengths after the step, num_emitted (B,) long; reads
    nothing at or past ``lens`` (a sibling's future must never be drafted from).
    """
    width = int(num_emitted.max()) if num_emitted.numel() else 0
    start = lens - num_emitted  # (B,)
    cols = (start[:, None] + torch.arange(width, device=lens.device)).clamp_max(tokens.shape[1] - 1)  # (B, W)
    got = tokens.gather(1, cols).tolist()
    return [row[:c] for row, c in zip(got, num_emitted.tolist())]


@register
class SuffixDrafter(Drafter):
    kind = "suffix"

    @classmethod
    def vllm_serving_notes(cls, spec) -> list[str]:
        """vLLM's suffix method is Arctic Inference's (Snowflake), a separate package."""
        return ["suffix: the vLLM that serves needs arctic-inference installed (pip install arctic-inference)"]

    @classmethod
    def vllm_speculative_config(cls, spec, draft_folder, draft_sample_method=None, require_installed=True) -> dict:
        """vLLM's suffix method (Arctic Inference) with the same tree settings (``suffix_decoding_*``).

        Raises:
            ValueError: ``require_installed`` and ``arctic-inference`` not importable here.
        """
        if require_installed and importlib.util.find_spec("arctic_inference") is None:
            raise ValueError(
                "drafter.kind=suffix with rollout.backend=vllm: vLLM's suffix decoding needs arctic-inference "
                "(pip install arctic-inference; on CPUs it is a C++ source build that did not build here), "
                "or use rollout.backend=workbench, whose suffix drafter is built in"
            )
        return {
            "method": "suffix",
            "num_speculative_tokens": spec.k,
            "suffix_decoding_max_tree_depth": spec.suffix_decoding_max_tree_depth,
            "suffix_decoding_max_spec_factor": spec.suffix_decoding_max_spec_factor,
            "suffix_decoding_min_token_prob": spec.suffix_decoding_min_token_prob,
            "suffix_decoding_max_cached_requests": spec.suffix_decoding_max_cached_requests,
        }

    def __init__(
        self,
        max_tree_depth: int = 24,
        max_spec_factor: float = 1.0,
        min_token_prob: float = 0.1,
        max_cached_requests: int = 10000,
    ):
        self.max_depth, self.factor, self.min_prob = max_tree_depth, max_spec_factor, min_token_prob
        self.history = RolloutHistory(max_cached_requests)  # persists across generate() calls
        self.batch: SuffixBatch | None = None

    @classmethod
    def from_spec(cls, spec, target: DrafterTarget | None = None, device=None) -> "SuffixDrafter":
        return cls(
            spec.suffix_decoding_max_tree_depth,
            spec.suffix_decoding_max_spec_factor,
            spec.suffix_decoding_min_token_prob,
            spec.suffix_decoding_max_cached_requests,
        )

    def start(self, ctx: DraftContext, hidden: dict[int, torch.Tensor]) -> None:
        if self.batch is not None:  # the previous batch was abandoned midway: keep what finished
            self.batch.finish()
        toks, plens, lens = ctx.tokens.tolist(), ctx.prompt_lens.tolist(), ctx.lens.tolist()  # one host copy each
        self.batch = SuffixBatch(self.history, [toks[b][: plens[b]] for b in range(len(toks))], self.max_depth)
        for b in range(len(toks)):
            self.batch.append(b, toks[b][plens[b] : lens[b]])  # the first sampled token(s)

    def admit(self, ctx: DraftContext, hidden: dict[int, torch.Tensor], n_old: int) -> None:
        """New rows join their prompt's corpus (a prompt already in the batch shares its trie)."""
        if self.batch is None:  # every earlier row finished (and went into the history)
            self.batch = SuffixBatch(self.history, [], self.max_depth)
        toks, plens, lens = ctx.tokens[n_old:].tolist(), ctx.prompt_lens[n_old:].tolist(), ctx.lens[n_old:].tolist()
        for b in range(len(toks)):
            self.batch.add_row(toks[b][: plens[b]], toks[b][plens[b] : lens[b]])

    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        if self.batch is None:
            raise RuntimeError("suffix drafter: propose() before start(): the engine calls start() after the prefill")
        B = len(self.batch)
        drafts = [self.batch.propose(b, k, self.factor, self.min_prob).tokens for b in range(B)]
        num = torch.tensor([len(d) for d in drafts], dtype=torch.long)
        tokens = torch.tensor([d + [0] * (k - len(d)) for d in drafts], dtype=torch.long).reshape(B, k)
        return DraftProposal(tokens.to(ctx.tokens.device), num.to(ctx.tokens.device), None)

    def accept(self, ctx: DraftContext, num_emitted: torch.Tensor, hidden: dict[int, torch.Tensor]) -> None:
        for b, new in enumerate(emitted_tokens(ctx.tokens, ctx.lens, num_emitted)):
            self.batch.append(b, new)

    def select(self, rows: torch.Tensor, moved: torch.Tensor | None = None) -> None:
        self.batch.select(rows.tolist())
        if len(self.batch) == 0:  # the batch is over: its rollouts go into the history
            self.batch.finish()
            self.batch = None
