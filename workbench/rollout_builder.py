"""One way to build a rollout: the spec resolved once into a rollout description, and every engine built from it.

    cfg = rollout_config(spec, tokenizer, generation_config)   # workbench.specs.resolve: the spec's description
    target = rollout_target(policy_model, cfg)                  # the policy's LeanLM copy the engine decodes with
    backend = build_backend(cfg, target, drafter)               # the workbench engine, or vLLM's (VLLMTarget)

The trainer (``workbench.grpo.build``), the asynchronous rollout worker, drafter init's completions,
the audit, the bench and the performance model's cost runs all build here, so a setting reaches every
engine the same way (packed weights and CUDA graphs in the rollout worker too) and the ground floor
(:mod:`workbench.rollout`, :mod:`workbench.vllm.runtime`) reads the typed description
(:mod:`workbench.rollout.config`), never the experiment spec. Callers that deviate from the spec on
purpose (the bench's ``--compile``, the audit's bucketed engines, fixed-length generation without
EOS) say so with ``dataclasses.replace`` on the description.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from workbench.models.chat import run_prompt_format
from workbench.prepack_rows import measured_min_rows
from workbench.rollout.backend import RolloutBackend
from workbench.rollout.config import EngineConfig, RolloutConfig, VLLMConfig
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams
from workbench.rollout.workbench_backend import WorkbenchBackend
from workbench.specs.drafter import DrafterSpec
from workbench.specs.sections import RolloutSpec, TaskSpec
from workbench.tags import TAG_ENGINE_PATH

__all__ = [
    "EngineConfig",
    "RolloutConfig",
    "VLLMConfig",
    "VLLMTarget",
    "build_backend",
    "eager",
    "engine_config",
    "engine_path",
    "packs_weights",
    "plain_backend",
    "describe_rollout",
    "rollout_target",
    "sampling_params",
    "vllm_config",
    "workbench_backend",
]


def engine_config(r: RolloutSpec) -> EngineConfig:
    """The workbench engine's options from the rollout section ``r`` (``rollout.*``)."""
    return EngineConfig(
        max_batch_size=r.max_batch_size,
        continuous=r.continuous_batching,
        compile=r.compile,
        cuda_graphs=r.cuda_graphs,
        prepack=r.prepack_weights,
        fixed_attention_length=r.fixed_attention_length,
    )


def vllm_config(r: RolloutSpec, dtype: str) -> VLLMConfig:
    """vLLM's engine arguments from the rollout section ``r`` (``rollout.vllm.*``; ``max_num_seqs`` null =
    ``rollout.max_batch_size``) and ``dtype`` (``model.dtype``)."""
    v = r.vllm
    return VLLMConfig(
        dtype=dtype,
        max_num_seqs=v.max_num_seqs or r.max_batch_size,
        enforce_eager=v.enforce_eager,
        tensor_parallel_size=v.tensor_parallel_size,
        cpu_kvcache_space_gib=v.cpu_kvcache_space_gib,
        gpu_memory_utilization=v.gpu_memory_utilization,
        cpu_expand_fix=v.cpu_expand_fix,
        draft_sample_method=v.draft_sample_method,
    )


def describe_rollout(
    r: RolloutSpec,
    drafter: DrafterSpec,
    task: TaskSpec,
    dtype: str,
    seed: int,
    tokenizer=None,
    generation_config: Any = None,
    max_new_tokens: int | None = None,
) -> RolloutConfig:
    """The rollout description from the rollout, drafter and task sections, ``model.dtype`` and the
    run's ``seed`` (:func:`workbench.specs.resolve.rollout_config` reads them off a spec).

    With ``tokenizer``, completions end at its eos and at the run's prompt format's stop ids (the
    chat template's end-of-turn, ``generation_config``'s eos list: ``PromptFormat.stop_token_ids``);
    without, generation is fixed-length (eos off: the bench's timed runs). ``max_new_tokens``
    (tokens): overrides ``rollout.max_new_tokens``.
    """
    sampling = sampling_params(r, task, tokenizer, generation_config, max_new_tokens)
    return RolloutConfig(r.backend, drafter, sampling, engine_config(r), vllm_config(r, dtype), seed)


def sampling_params(
    r: RolloutSpec, task: TaskSpec, tokenizer=None, generation_config: Any = None, max_new_tokens: int | None = None
) -> SamplingParams:
    """The rollouts' sampling from the rollout section ``r``: temperature, top-p/k, the sampler; with
    ``tokenizer``, its eos and the stop ids of the run's prompt format (``task``'s chat template and
    ``generation_config``'s eos list); without, fixed-length generation. ``max_new_tokens`` (tokens)
    overrides ``rollout.max_new_tokens``."""
    eos, stops = None, ()
    if tokenizer is not None:
        eos = tokenizer.eos_token_id
        stops = run_prompt_format(task, tokenizer).stop_token_ids(generation_config)
    return SamplingParams(
        r.temperature,
        r.top_p,
        r.top_k,
        max_new_tokens or r.max_new_tokens,
        eos,
        stops,
        sampler=r.sampler,
        keyed_draft=r.keyed_draft,
    )


def rollout_target(model, cfg: RolloutConfig) -> LeanLM:
    """The rollout copy of the policy ``model`` (Hugging Face) the workbench engine and its drafters read.

    Raises:
        ValueError: an architecture the workbench engine does not run (names model.target).
    """
    lm = LeanLM.from_hf(model, what="model.target")
    lm.fixed_attention_length = cfg.engine.fixed_attention_length
    return lm


def workbench_backend(
    target: LeanLM, drafter=None, k: int = 3, engine: EngineConfig = EngineConfig()
) -> WorkbenchBackend:
    """The workbench engine over ``target`` speculating ``k`` tokens with ``drafter`` (None: plain
    decoding), with ``engine``'s options; packed weights switch kernels at this machine's measured
    row counts (:func:`workbench.prepack_rows.measured_min_rows`).

    Raises:
        ValueError: CUDA graphs off a CUDA device, packed weights off CPU float32 (each names the field).
    """
    packed = packs_weights(engine, target)
    backend = WorkbenchBackend(
        target,
        drafter,
        k=k,
        max_batch_size=engine.max_batch_size,
        continuous=engine.continuous,
        retire_buckets=engine.retire_buckets,
        compile=engine.compile,
        cuda_graphs=engine.cuda_graphs,
        prepack=packed,
        prepack_min_rows=measured_min_rows,
    )
    backend.tags = {**backend.tags, TAG_ENGINE_PATH: engine_path(engine, packed)}
    return backend


def packs_weights(engine: EngineConfig, target: LeanLM) -> bool:
    """Whether the workbench engine runs ``target`` with packed weights: ``engine.prepack`` where set;
    None (``rollout.prepack_weights`` left at its default) = wherever packing applies: eager forwards
    of CPU float32 weights with oneDNN. Each packed weight still takes ``F.linear`` below the row count
    at which it measured faster (:func:`workbench.prepack_rows.measured_min_rows`), so on a machine
    where packing never wins nothing changes but the one-off measurement (under a second a shape)."""
    if engine.prepack is not None:
        return engine.prepack
    w = target.lm_head.weight
    return (
        not (engine.compile or engine.cuda_graphs)
        and w.device.type == "cpu"
        and w.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
    )


def engine_path(engine: EngineConfig, packed: bool) -> str:
    """The forward path the workbench engine runs, as logged and printed: ``cuda graphs``,
    ``compiled`` (``, packed weights``), ``eager, packed weights`` or ``eager``."""
    if engine.cuda_graphs:
        return "cuda graphs"
    if engine.compile:
        return "compiled, packed weights" if packed else "compiled"
    return "eager, packed weights" if packed else "eager"


def plain_backend(target: LeanLM, engine: EngineConfig = EngineConfig()) -> WorkbenchBackend:
    """Plain (autoregressive) decoding on the workbench engine: references, completions, baselines."""
    return workbench_backend(target, None, engine=engine)


@dataclass
class VLLMTarget:
    """What a vLLM engine needs beyond the description: the policy's folder (vLLM's model), the
    device type (``cpu``/``cuda``), the guard's tags (:func:`workbench.vllm.admit`, called first);
    for a workbench drafter handed over: its init folder, the target's ``LMConfig`` (an EAGLE-3
    export's shapes) and the ``LeanLM`` it shares modules with while it trains online."""

    path: Path | str
    device_type: str
    tags: dict[str, str] = field(default_factory=dict)
    init_path: Path | None = None
    target_cfg: Any = None
    drafter_target: LeanLM | None = None


def build_backend(
    cfg: RolloutConfig, target: LeanLM | None, drafter=None, vllm: VLLMTarget | None = None
) -> RolloutBackend:
    """The backend ``cfg.backend`` names, speculating ``cfg.k`` tokens with ``drafter``.

    Raises:
        ValueError: ``vllm`` missing for ``backend=vllm``, or what the engine refuses (names the
            field); ImportError: vLLM not installed (names the extra).
    """
    if cfg.backend == "vllm":
        if vllm is None:
            raise ValueError("rollout.backend=vllm: the builder needs the policy's folder and device (VLLMTarget)")
        from workbench.vllm import vllm_backend

        return vllm_backend(
            cfg, vllm.path, vllm.device_type, vllm.tags, drafter, vllm.init_path, vllm.target_cfg, vllm.drafter_target
        )
    if target is None:
        raise ValueError("rollout.backend=workbench: the workbench engine needs the policy's LeanLM copy")
    return workbench_backend(target, drafter, cfg.k, cfg.engine)


def eager(engine: EngineConfig) -> EngineConfig:
    """``engine`` without compile, CUDA graphs or packed weights (the batch settings kept)."""
    return replace(engine, compile=False, cuda_graphs=False, prepack=False)
