"""The drafter interface: what the rollout engine asks of a drafter, and what a drafter gets of its target.

It lives beside the engine (the bottom layer); ``drafters/`` implements it, one module per kind, and
registers each kind by name (``drafters.registry``). The rollout engine owns the batch (token ids,
lengths, the target's KV cache); a drafter sees it through a :class:`DraftContext` and returns a :class:`DraftProposal`
per verification step. Drafters that read the target (``mtp``, ``eagle3``) declare ``hidden_layers``; the engine then
returns those hidden states from the verification forward and hands them over in ``accept``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from workbench.rollout.keyed import coupled_draft
from workbench.rollout.sampling import SamplingParams, sample

if TYPE_CHECKING:
    from workbench.rollout.model import LeanLM


@dataclass(frozen=True)
class DrafterTarget:
    """What a drafter gets of the target it drafts for, when it is built (``Drafter.from_spec``).

    lm: the target's rollout model (``LeanLM``): its config, embedding and LM head (mtp and eagle3
        share them), its depth (eagle3's aux layer ids).
    tokenizer: the target's tokenizer (a ``draft_model`` must share it), or None where unknown.
    init_path: a drafter-init checkpoint folder (``wb drafter init``; ``workbench.drafter_init``)
        to load instead of a fresh drafter, or None.
    token_counts: (V,) float token frequencies of the data a fresh drafter is initialised on;
        eagle3 picks its draft vocabulary (the most frequent ``draft_vocab_size`` tokens) from them.
    path: the target's checkpoint folder (a ``draft_model`` made of the target's first layers,
        ``drafter.draft_layers``, is read from it), or None where unknown.
    """

    lm: "LeanLM"
    tokenizer: Any = None
    init_path: Path | None = None
    token_counts: torch.Tensor | None = None
    path: Path | None = None


@dataclass
class DraftContext:
    """What a drafter may read about the batch at one call. Row b is one rollout.

    The engine makes a new context for every call (``start``, ``propose``, ``accept``) with the
    values of that moment and never changes ``lens``, ``prompt_lens`` or ``group_ids`` of one it
    handed out; ``tokens`` is the engine's buffer, written in place past ``lens[b]`` afterwards.
    So a drafter reads what it needs during the call and keeps no context across calls.

    tokens: (B, T_max) long, prompt + generated tokens; valid up to ``lens[b]`` (exclusive).
        The last valid token (``lens[b] - 1``) is not yet in the target's KV cache: it is the
        first input of the next verification step.
    lens: (B,) long current sequence lengths (tokens); in ``accept``, the lengths after the step.
    prompt_lens: (B,) long prompt lengths (tokens).
    group_ids: (B,) long; rollouts of the same prompt share a group id.
    sampling: the rollout sampling parameters (apply the same transform to draft logits).
    generator: torch RNG of the run.
    prompt_rows, prompt_index: set for ``start`` only (prefix sharing): (U,) long, a row holding
        each distinct prompt, and (B,) long, each row's distinct prompt (``tokens[prompt_rows]
        [prompt_index]`` repeats the prompts). A GRPO group's G rollouts share one prompt.
    max_len: max(lens) as a host int (the engine reads it once per step with its other counts), so
        a drafter can size attention without reading the device (``LeanLM.forward(max_start=)``).
    """

    tokens: torch.Tensor
    lens: torch.Tensor
    prompt_lens: torch.Tensor
    group_ids: torch.Tensor
    sampling: SamplingParams
    generator: torch.Generator | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    prompt_rows: torch.Tensor | None = None
    prompt_index: torch.Tensor | None = None
    max_len: int | None = None
    seeds: torch.Tensor | None = None  # (B,) int64 row seeds under keyed sampling
    n_gen: torch.Tensor | None = None  # (B,) long completion tokens so far: the next token's completion position

    def draw(self, q: torch.Tensor, j: int = 0, ids: torch.Tensor | None = None) -> torch.Tensor:
        """A draft token per row from q (B, V'), for the j-th draft of this proposal (0-based): sampled from
        q with ``generator`` (rejection sampling's probabilistic drafts); under keyed sampling q's argmax
        (``keyed_draft="argmax"``, vLLM's proposers) or the coupled draft (``"coupled"``: q's Gumbel-max sample
        under the target's keyed noise at completion position ``n_gen + j``; ``ids`` (V',) maps a reduced draft
        vocabulary's columns to token ids). Keyed verification accepts a draft iff it equals the target's
        keyed sample. Returns (B,) long column indices into q. Model drafters draw their drafts here."""
        if not self.sampling.keyed:
            return sample(q, self.generator)
        if self.sampling.keyed_draft == "argmax" or self.seeds is None or self.n_gen is None:
            return q.argmax(-1)
        return coupled_draft(q, self.seeds, self.n_gen + j, ids)

    def distinct_prompts(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(prompt_rows (U,), prompt_index (B,)); every row its own prompt when not set."""
        if self.prompt_rows is None or self.prompt_index is None:
            rows = torch.arange(self.lens.shape[0], device=self.lens.device)
            return rows, rows
        return self.prompt_rows, self.prompt_index


@dataclass
class DraftProposal:
    """tokens (B, k) long; num_draft (B,) long real drafts per row (0..k); probs (B, k, V) q or None."""

    tokens: torch.Tensor
    num_draft: torch.Tensor
    probs: torch.Tensor | None = None


class Drafter:
    """Proposes up to k draft tokens per row for one verification step.

    Lifecycle per rollout batch: ``start(ctx, hidden)`` once after the target's prefill, then per
    step ``propose(ctx, k)`` -> verification -> ``accept(ctx, num_emitted, hidden)``;
    ``select(rows)`` when finished rows leave the batch, ``admit`` when waiting prompts join it. Each call gets a fresh
    :class:`DraftContext`; what a drafter keeps between calls is its own state (caches).
    """

    # What the rest of the workbench asks of a kind (capabilities, not name switches): a new kind sets these in
    # its own module and registers itself, and init, online adaptation and the vLLM backend follow.
    kind: ClassVar[str] = ""
    trainable: ClassVar[bool] = False  # has weights: draft_loss/train_parameters (init and online adaptation)
    distill_temperature: float = 1.0  # the loss's temperature (drafter.distill_temperature), set by build_drafter
    arch_fields: ClassVar[tuple[str, ...]] = ()  # DrafterSpec fields that shape the weights (the init cache key)
    vllm_weights: ClassVar[bool] = False  # vLLM serves this drafter's own weights (exported, reloaded when adapted)
    # speculative_config.model is a head folder in vLLM's layout that `wb export` writes (not a checkpoint given)
    vllm_head_folder: ClassVar[bool] = False
    hidden_layers: tuple[int, ...] = ()  # target layers whose hidden states this drafter reads
    # How the performance models (workbench.perf) cost a step's drafting: "host" drafts from the tokens on the
    # host (no model forward; measured host time); "model" is a draft model of its own (a checkpoint,
    # drafter.model; one forward curve serves every k); "head" reads the target's hidden states (measured per k)
    draft_cost: ClassVar[str] = "host"
    # a head's input fc fuses this many hidden-size vectors into one (n·H -> H) in the roofline's shape; 0: none
    head_fc_inputs: ClassVar[int] = 0
    reduced_draft_vocab: ClassVar[bool] = False  # the head's LM head covers drafter.draft_vocab_size ids only

    @classmethod
    def draft_forwards(cls, k: int) -> tuple[tuple[int, int], ...]:
        """The draft forwards of one verification step at speculation length ``k``, as (tokens per row,
        times) pairs, for the roofline (``workbench.perf.simulate``): none for drafters on the host."""
        return ()

    @classmethod
    def served_as_given(cls, spec) -> bool:
        """Whether vLLM serves the drafter section ``spec`` from ``drafter.model`` as given, with nothing
        to load or train first: no kind, unless a subclass knows better."""
        return False

    @classmethod
    def initialised_by_default(cls, spec) -> bool:
        """Whether ``drafter.init.data: auto`` trains this kind before the first step (``spec``: a
        ``DrafterSpec``): every trainable kind, unless a subclass knows better."""
        return cls.trainable

    @classmethod
    def given_trained(cls, spec) -> bool:
        """Whether the drafter section ``spec`` hands over trained weights (``drafter.model`` a finished
        head), so there is nothing to initialise: no kind, unless a subclass knows better."""
        return False

    @classmethod
    def vllm_serving_notes(cls, spec) -> list[str]:
        """What the reader of a vLLM export of the drafter section ``spec`` must know to serve it (a
        package to install, a fixed k): none, unless a subclass knows better."""
        return []

    def vllm_state(self) -> list[tuple[str, torch.Tensor]]:
        """The drafter's current weights under the names of the checkpoint vLLM serves it from (a draft
        model's Hugging Face names, a head's vLLM layout), reloaded into vLLM after online adaptation.

        Raises:
            ValueError: the kind has no drafter model in vLLM (``vllm_weights`` false).
        """
        raise ValueError(f"drafter.kind={self.kind}: no drafter model to reload into vLLM")

    @classmethod
    def vllm_speculative_config(
        cls, spec, draft_folder: str | None, draft_sample_method: str | None = None, require_installed: bool = True
    ) -> dict[str, Any]:
        """vLLM's ``speculative_config`` for the drafter section ``spec`` (a ``DrafterSpec``), in vLLM's names
        (``method``, ``num_speculative_tokens``, the method's own fields).

        draft_folder: what :meth:`vllm_folder` returned (the drafter's Hugging Face folder);
        draft_sample_method: vLLM's ``draft_sample_method`` for model drafters (None: vLLM's default);
        require_installed: refuse a method whose package is not importable here (False: the config is for
        another machine's vLLM, as ``wb export`` writes it).

        Raises:
            ValueError: the kind has no vLLM method, or settings vLLM cannot run with it (names the field).
        """
        raise ValueError(f"drafter.kind={spec.kind!r} has no vLLM speculative method; use rollout.backend=workbench")

    @classmethod
    def _vllm_model_method(cls, spec, draft_folder: str | None, draft_sample_method: str | None = None) -> dict:
        """The ``speculative_config`` of a vLLM method named as the kind that loads a drafter model from
        ``draft_folder`` (draft_model, eagle3)."""
        cfg = {"method": cls.kind, "model": draft_folder, "num_speculative_tokens": spec.k}
        if draft_sample_method is not None:
            cfg["draft_sample_method"] = draft_sample_method
        return cfg

    @classmethod
    def vllm_folder(
        cls, spec, drafter: "Drafter | None", init_path, target_cfg, work, stop_ids: tuple[int, ...] = ()
    ) -> str | None:
        """The folder vLLM loads this drafter from (``speculative_config.model``), written under ``work``
        (a ``Path``) if it must be exported; None for drafters vLLM runs without weights (no kind, unless a
        subclass knows better).

        spec: the ``DrafterSpec``; drafter: the workbench drafter built for the run, or None; init_path:
        its init checkpoint folder, or None; target_cfg: the target's ``LMConfig`` (a head's export needs
        its shape); stop_ids: token ids a head's mask token must not be.
        """
        return None

    @classmethod
    def arch_key(cls, spec) -> dict:
        """The spec's weight-shaping settings (``arch_fields``), part of the init checkpoint's cache key."""
        return {f: getattr(spec, f) for f in cls.arch_fields}

    def start(self, ctx: DraftContext, hidden: dict[int, torch.Tensor]) -> None:
        """After the target's prefill; ``hidden`` = {layer: (U, P, H)} of the U distinct prompts
        (right-padded, in the order of ``ctx.prompt_rows``). Build the state once per distinct
        prompt, then expand it to the B rows with ``ctx.prompt_index`` (prefix sharing)."""

    def propose(self, ctx: DraftContext, k: int) -> DraftProposal:
        """Up to k drafts per row continuing ``tokens[b, :lens[b]]``: a :class:`DraftProposal` with
        tokens (B, k) long, num_draft (B,) long in 0..k, probs (B, k, V) float32 q over the target
        vocabulary or None (deterministic drafts: q = one-hot). The verification step then feeds
        (B, k+1) tokens, the last valid one and the drafts, at positions lens[b]-1 ... lens[b]-1+k."""
        raise NotImplementedError

    def accept(self, ctx: DraftContext, num_emitted: torch.Tensor, hidden: dict[int, torch.Tensor]) -> None:
        """After a verification step, before finished rows leave.

        ctx: the batch after the step: ``ctx.lens`` (B,) = the lengths at ``propose`` +
            ``num_emitted``; ``ctx.tokens`` holds the emitted tokens.
        num_emitted: (B,) long tokens appended to each row by the step, 1..k+1: its accepted drafts
            and the target's correction or bonus token, cut at EOS and at the token budget
            (rows so cut finish with this step): the first ``num_emitted - 1`` drafts were accepted and kept.
        hidden: {layer: (B, k+1, H)} the target's hidden states of the verification's inputs (see
            ``hidden_layers``), column t at position ``ctx.lens - num_emitted - 1 + t``; empty
            unless the drafter declares ``hidden_layers``.
        """

    def select(self, rows: torch.Tensor, moved: torch.Tensor | None = None) -> None:
        """Keep only ``rows`` (R,) long, indices into the current batch (finished rows left): row j
        becomes row ``rows[j]``. ``moved``: (m,) the rows j with ``rows[j] != j`` when the engine
        knows them, for caches to copy only those (``KVCache.select``); None = unknown."""

    def admit(self, ctx: DraftContext, hidden: dict[int, torch.Tensor], n_old: int) -> None:
        """Continuous batching: rows ``n_old..B-1`` of ``ctx`` joined the batch after the step's
        ``accept`` and ``select``, freshly prefilled with their first token sampled, as at ``start``:
        ``hidden`` = {layer: (U, P, H)} of their U distinct prompts, ``ctx.prompt_rows`` (U,) rows of
        the batch holding each, ``ctx.prompt_index`` (B - n_old,) each new row's distinct prompt.
        Rows 0..n_old-1 keep their state. Drafters without per-row state need nothing."""
        raise NotImplementedError(f"drafter {self.kind!r} cannot admit rows (rollout.continuous_batching=false)")

    def sync(self, target: torch.nn.Module) -> None:
        """Weight sync in the `prepare` stage (drafters sharing target weights refresh them)."""

    # -- trainable drafters (``trainable = True``): drafter init and online adaptation
    def train_parameters(self) -> list[torch.nn.Parameter]:
        raise NotImplementedError(f"drafter {self.kind!r} has no trainable parameters")

    def draft_loss(self, batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        """Differentiable loss on a :class:`drafters.targets.DraftBatch` and its stats
        (``draft/loss``, ``draft/top1_agreement``)."""
        raise NotImplementedError(f"drafter {self.kind!r} cannot be trained")

    def after_update(self) -> None:
        """After an optimiser step: refresh whatever copy the proposals run on."""

    @classmethod
    def from_spec(cls, spec: Any, target: DrafterTarget, device: torch.device) -> "Drafter":
        """Build the drafter for ``spec`` (a ``DrafterSpec``) and ``target`` on ``device``."""
        raise NotImplementedError(f"drafter {cls.kind!r} cannot be built from a spec")

    def save(self, folder: Any) -> None:
        """Write a checkpoint folder that ``from_spec`` can load (``target.init_path``)."""
        raise NotImplementedError(f"drafter {self.kind!r} has no checkpoint")
