"""The drafter section of an experiment spec: which drafter proposes, its vLLM ``speculative_config``
fields (``method`` = ``kind``, ``num_speculative_tokens`` = ``k``), its initialisation and its online
adaptation. Every section forbids unknown keys (:class:`workbench.specs.sections._Section`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from workbench.specs.sections import _Section


class DrafterInitSpec(_Section):
    """Drafter initialisation: what the drafter is trained on before the first GRPO step."""

    data: str = Field(
        "auto",
        description="auto (draft_model: none, mtp/eagle3: in_domain) | none | in_domain (the target's sampled "
        "completions of RL-task prompts) | chat (the target's completions of general-corpus prompts) | path to a "
        "jsonl/parquet of prompts",
    )
    num_prompts: int = Field(512, ge=1, description="prompts the target completes to make the init data")
    prompt_field: str = Field("prompt", description="prompt column of a user dataset")
    steps: int = Field(400, ge=0, description="optimiser steps")
    lr: float = Field(2e-3, gt=0.0, description="peak AdamW lr (warmup then cosine)")
    batch_size: int = Field(16, ge=1, description="sequences per optimiser step")
    seed: int | None = Field(
        None,
        description="seed of the init data's prompts, sampling and training; null = the run's `seed` (a "
        "`seed=0..4` sweep then trains one drafter per seed; set 0 to share one drafter across the seeds)",
    )

    @field_validator("data", mode="before")
    @classmethod
    def _none_word(cls, v: Any) -> Any:
        return "none" if v is None else v  # `drafter.init.data=none` parses as null


class DrafterOnlineSpec(_Section):
    """Online drafter adaptation during GRPO (the `draft_train` stage, after `train`)."""

    enabled: bool = False
    every: int = Field(1, ge=1, description="update the drafter every N GRPO steps")
    lr: float = Field(1e-3, gt=0.0)
    steps: int = Field(4, ge=1, description="optimiser steps per update")
    batch_size: int = Field(16, ge=1, description="sequences per optimiser step, drawn from the buffer")
    buffer_size: int = Field(256, ge=1, description="rollouts kept (FIFO) with their captured target states")


class DrafterSpec(_Section):
    """vLLM speculative_config vocabulary, flat, so switching `kind` by override keeps the rest valid."""

    kind: str = Field(
        "draft_model",
        description="none | ngram | suffix | draft_model | mtp | eagle3 | dflash (see `drafters.DRAFTERS`)",
    )
    k: int = Field(3, ge=1, le=16, description="num_speculative_tokens: draft tokens per verification step")
    adaptive: bool = Field(
        False,
        description="choose k_t in 0..k before every step (0 = plain decode) for the most expected tokens per second "
        "from the live batch size, the measured forward and drafter costs and running acceptance estimates "
        "(workbench.rollout.kpolicy.AdaptiveK); k is then the maximum; ignored with kind none",
    )
    adaptive_measured_steps: bool = Field(
        True,
        description="adaptive: correct the cost curves by the steps' measured wall times (what the curves leave "
        "out: sampling, drafter bookkeeping, Python); false: the curves alone, so the k_t sequence is reproducible",
    )
    prompt_lookup_min: int = Field(1, ge=1, description="ngram: shortest suffix to match")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: longest suffix to match")
    suffix_decoding_max_tree_depth: int = Field(
        24, ge=2, le=1024, description="suffix: depth of the suffix tries (tokens); bounds match length + drafts"
    )
    suffix_decoding_max_spec_factor: float = Field(
        1.0, gt=0.0, le=1024.0, description="suffix: drafts allowed = floor(factor × match length), at most k"
    )
    suffix_decoding_min_token_prob: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description="suffix: stop drafting before the continuation's running empirical probability "
        "(product of count ratios) falls below this",
    )
    suffix_decoding_max_cached_requests: int = Field(
        10000,
        ge=0,
        description="suffix: earlier rollouts kept across GRPO steps (FIFO), drafted from by rows of the "
        "same prompt; 0 = none (own and sibling rollouts only)",
    )
    model: str = Field(
        "tiny-draft",
        description="draft_model: preset name, checkpoint folder or Hugging Face Hub id ORG/NAME[@REVISION] "
        "(docs/hub-models.md) with the target's tokenizer; eagle3: a head in vLLM's layout (wb drafter export), "
        "a folder or a Hub id",
    )
    draft_layers: int | None = Field(
        None,
        ge=1,
        description="draft_model: build the draft model from the target itself — its embeddings, first N decoder "
        "layers, final norm and LM head (self-speculative early exit: Zhang et al. 2023 arXiv 2309.08168, LayerSkip "
        "arXiv 2404.16710) — distilled on the target's outputs by drafter.init (DistillSpec, arXiv 2310.08461); "
        "drafter.model is then not read; null: drafter.model",
    )
    num_nextn_predict_layers: int = Field(
        1, ge=1, le=8, description="mtp: number of MTP modules D (the last one recurs for k > D)"
    )
    eagle_aux_hidden_state_layer_ids: list[int] | None = Field(
        None,
        description="eagle3: target layers whose inputs are fused (low, mid, high); default (2, L//2, L-3) mapped "
        "for shallow models",
    )
    draft_vocab_size: int | None = Field(
        None, ge=1, description="eagle3: reduced draft vocabulary; default vocab/4 (full vocab without init data)"
    )
    ttt_steps: int = Field(7, ge=1, le=16, description="mtp/eagle3: training-time-test unroll steps")
    ttt_decay: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="mtp/eagle3: weight of unroll step j is ttt_decay**j; dflash: of slot i, **(i-1)",
    )
    distill_temperature: float = Field(
        1.0,
        gt=0.0,
        le=4.0,
        description="temperature of the drafter's training loss (init and online): draft and target logits are both "
        "divided by it (Hinton et al. 2015; TRL GKD's `temperature`), so the drafter learns softmax(z / T). A drafter "
        "proposes at rollout.temperature; setting both equal trains the distribution the rejection sampler compares "
        "(DistillSpec, arXiv 2310.08461). Changes what the drafter learns, never what rollouts follow",
    )
    dflash_block_size: int = Field(
        8,
        ge=2,
        le=17,
        description="dflash: query slots of the one draft forward (the last emitted token, then block_size - 1 "
        "masks; z-lab's block_size); k <= dflash_block_size - 1",
    )
    on_collapse: Literal["warn", "fail"] = Field(
        "warn",
        description="the drafter-health alarm: after each step's weight sync, acceptance about zero (< 0.02 or a "
        "tenth of the earlier steps' median, when that median > 0.1) or below the run's own step-to-step band "
        "(after 3 steps: median - max(4 robust sd, 0.05)) logs spec/drafter_health 0 (else 1) and warns once; "
        "fail: also ends the run FAILED with one line",
    )
    init: DrafterInitSpec = Field(default_factory=DrafterInitSpec)
    online: DrafterOnlineSpec = Field(default_factory=DrafterOnlineSpec)

    @field_validator("eagle_aux_hidden_state_layer_ids")
    @classmethod
    def _three_layers(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 3 or min(v) < 0):
            raise ValueError(
                "eagle_aux_hidden_state_layer_ids needs three layer indices >= 0 (low, mid, high), e.g. [1, 2, 3]"
            )
        return v

    def init_data(self) -> str:
        """``init.data`` with ``auto`` resolved for this kind."""
        if self.init.data != "auto":
            return self.init.data
        from drafters import drafter_class

        cls = drafter_class(self.kind)
        return "in_domain" if cls is not None and cls.initialised_by_default(self) else "none"

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        from drafters import DRAFTERS

        allowed = ["none", *DRAFTERS]
        if v not in allowed:
            raise ValueError(f"unknown drafter kind {v!r}; allowed values: {', '.join(allowed)}")
        return v

    @model_validator(mode="after")
    def _lookup_range(self) -> "DrafterSpec":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self
