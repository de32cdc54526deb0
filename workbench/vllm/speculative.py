"""The spec's drafter and run settings checked against what vLLM runs, and vLLM's ``speculative_config``
(pure; no vLLM import).

Names are vLLM's (``num_speculative_tokens``, ``prompt_lookup_min/max``, ``suffix_decoding_*``,
``draft_sample_method``); what vLLM cannot run from a workbench spec is refused here, before any
engine starts or any MLflow run opens, with the field to change. The engine's own arguments, from the
resolved rollout description, are the ground floor's (:mod:`workbench.vllm.runtime.config`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from workbench.specs.drafter import DrafterSpec
from workbench.specs.sections import GRPOSpec, RolloutSpec


@dataclass(frozen=True)
class AdmissionConfig:
    """What the vLLM backend's admission reads of a run (resolved by
    :func:`workbench.specs.resolve.admission_config`).

    name: the spec's name (the `wb audit` command a refusal suggests starts from it); target:
    ``model.target``; dtype: ``model.dtype``; rollout, drafter, grpo: those sections.
    """

    name: str
    target: str
    dtype: str
    rollout: RolloutSpec
    drafter: DrafterSpec
    grpo: GRPOSpec


def check_vllm_run(run: AdmissionConfig) -> None:
    """Refuse run settings the vLLM backend does not run.

    Raises:
        ValueError: names the field and the fix.
    """
    r, d, g = run.rollout, run.drafter, run.grpo
    if r.compile or r.cuda_graphs:
        raise ValueError(
            "rollout.compile / rollout.cuda_graphs tune the workbench engine; with rollout.backend=vllm set "
            "rollout.vllm.enforce_eager=false to let vLLM compile and capture graphs"
        )
    if r.prepack_weights:
        raise ValueError(
            "rollout.prepack_weights packs the workbench engine's weights; vLLM-CPU packs its own: "
            "set rollout.prepack_weights=false with rollout.backend=vllm"
        )
    if d.kind != "none" and d.adaptive:
        raise ValueError(
            "drafter.adaptive chooses k per step inside the workbench engine; vLLM fixes "
            "num_speculative_tokens per engine: set drafter.adaptive=false or rollout.backend=workbench"
        )
    if g.async_.enabled:
        raise ValueError(
            "grpo.async.enabled: the asynchronous rollout worker runs the workbench engine; "
            "set grpo.async.enabled=false with rollout.backend=vllm"
        )
    if g.backend != "single":
        raise ValueError(
            "grpo.backend=deepspeed with rollout.backend=vllm is not supported yet (one colocated engine "
            "per process); set grpo.backend=single"
        )
    if not r.continuous_batching:
        raise ValueError(
            "rollout.continuous_batching=false decodes chunks in the workbench engine; vLLM's scheduler always "
            "batches continuously: set rollout.continuous_batching=true with rollout.backend=vllm"
        )
    if r.sampler != "rejection":
        raise ValueError(
            "rollout.sampler=keyed is the workbench engine's drafter-invariant sampler; vLLM verifies by rejection "
            "sampling: set rollout.sampler=rejection with rollout.backend=vllm"
        )
    if r.fixed_attention_length:
        raise ValueError(
            "rollout.fixed_attention_length is a workbench-engine option; set it false with rollout.backend=vllm"
        )
    speculative_config(d, draft_folder="-", check_only=True)


def speculative_config(
    d,
    draft_folder: str | None,
    draft_sample_method: str | None = None,
    check_only: bool = False,
    require_installed: bool = True,
) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for the drafter section ``d`` (``DrafterSpec``); None for kind none.

    draft_folder: the drafter's Hugging Face folder (draft_model: the draft checkpoint, its init if
    trained; eagle3, dflash: the head exported in vLLM's layout by ``drafters.eagle3_vllm.export_eagle3``,
    ``drafters.dflash_vllm.export_dflash``). require_installed: refuse suffix without ``arctic-inference``
    importable here (False: the config is for another machine's vLLM, as ``wb export`` writes it).

    Raises:
        ValueError: mtp (vLLM runs MTP only from checkpoints with native MTP layers), suffix without
            ``arctic-inference`` installed, dflash at a k other than its block size - 1 or with online
            adaptation; each names the field.
    """
    k = d.k
    if d.kind == "none":
        return None
    if d.kind == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": d.prompt_lookup_min,
            "prompt_lookup_max": d.prompt_lookup_max,
        }
    if d.kind == "suffix":
        if require_installed and importlib.util.find_spec("arctic_inference") is None:
            raise ValueError(
                "drafter.kind=suffix with rollout.backend=vllm: vLLM's suffix decoding needs arctic-inference "
                "(pip install arctic-inference; on CPUs it is a C++ source build that did not build here), "
                "or use rollout.backend=workbench, whose suffix drafter is built in"
            )
        return {
            "method": "suffix",
            "num_speculative_tokens": k,
            "suffix_decoding_max_tree_depth": d.suffix_decoding_max_tree_depth,
            "suffix_decoding_max_spec_factor": d.suffix_decoding_max_spec_factor,
            "suffix_decoding_min_token_prob": d.suffix_decoding_min_token_prob,
            "suffix_decoding_max_cached_requests": d.suffix_decoding_max_cached_requests,
        }
    if d.kind == "mtp":
        raise ValueError(
            "drafter.kind=mtp with rollout.backend=vllm: vLLM runs MTP only from target checkpoints that carry "
            "native MTP layers (DeepSeek-V3, Qwen3-Next, ...), not the workbench's own MTP heads; use "
            "drafter.kind=eagle3 or draft_model, or rollout.backend=workbench"
        )
    if d.kind in ("draft_model", "eagle3"):
        cfg = {"method": d.kind, "model": draft_folder, "num_speculative_tokens": k}
        if draft_sample_method is not None:
            cfg["draft_sample_method"] = draft_sample_method
        return cfg
    if d.kind == "dflash":
        # vLLM's block is k + 1 slots; ours is always the trained dflash_block_size (two-way attention: the
        # block's length shapes every q_i), so the two propose alike only at k = dflash_block_size - 1
        if d.online.enabled:
            raise ValueError(
                "drafter.online.enabled=true with drafter.kind=dflash and rollout.backend=vllm: vLLM 0.32 cannot "
                "reload a DFlash head in place (its fused context projection is built once, at load); set "
                "drafter.online.enabled=false, or rollout.backend=workbench"
            )
        if k != d.dflash_block_size - 1:
            raise ValueError(
                f"drafter.k={k} with drafter.kind=dflash and rollout.backend=vllm: vLLM runs a block of k + 1 slots "
                f"and the head was trained on drafter.dflash_block_size={d.dflash_block_size}; set "
                f"drafter.k={d.dflash_block_size - 1} or drafter.dflash_block_size={k + 1}"
            )
        return {"method": "dflash", "model": draft_folder, "num_speculative_tokens": k}
    raise ValueError(f"drafter.kind={d.kind!r} has no vLLM speculative method; use rollout.backend=workbench")
