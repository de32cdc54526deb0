"""The rollout description: what a rollout backend is built from, resolved once from the experiment spec.

The ground floor never reads the experiment spec: ``workbench.specs.resolve.rollout_config`` turns
``rollout.*``, ``drafter.k``, ``model.dtype`` and the prompt format's stop ids into these frozen
records, and every engine (the workbench engine, vLLM's) is built from them by that one builder. As
vLLM's ``VllmConfig`` splits into ``SchedulerConfig``, ``SpeculativeConfig``, ..., the description is
one record per concern:

| record | spec fields | read by |
|---|---|---|
| :class:`EngineConfig` | ``rollout.max_batch_size``, ``continuous_batching``, ``compile``, ``cuda_graphs``, ``prepack_weights``, ``fixed_attention_length`` | the workbench engine |
| :class:`VLLMConfig` | ``model.dtype``, ``rollout.vllm.*`` (``max_num_seqs`` resolved) | vLLM's engine |
| :class:`RolloutConfig` | ``rollout.backend``, ``drafter`` (kind, k, its fields), the sampling, ``seed`` | the builder |
"""  # noqa: E501 (a Markdown table: one row a line)

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.rollout.sampling import SamplingParams


@dataclass(frozen=True)
class EngineConfig:
    """How the workbench engine decodes.

    max_batch_size: rows decoded together; continuous: admit waiting rows as others finish
    (``rollout.continuous_batching``); retire_buckets: shrink the batch only to these sizes (CUDA
    graphs' capture sizes; None = retire rows at once); compile, cuda_graphs: ``torch.compile`` the
    forwards, as CUDA graphs; prepack: CPU float32, eager: oneDNN-packed weights
    (``rollout.prepack_weights``; None = wherever they apply, resolved by the builder);
    fixed_attention_length: attention over the whole cache length every step (``rollout.fixed_attention_length``).
    """

    max_batch_size: int = 256
    continuous: bool = True
    retire_buckets: tuple[int, ...] | None = None
    compile: bool = False
    cuda_graphs: bool = False
    prepack: bool | None = False
    fixed_attention_length: bool = False


@dataclass(frozen=True)
class VLLMConfig:
    """vLLM's engine arguments (``rollout.vllm.*``; ``max_num_seqs`` already resolved from
    ``rollout.max_batch_size`` when unset). ``cpu_kvcache_space_gib`` in GiB."""

    dtype: str = "float32"
    max_num_seqs: int = 256
    enforce_eager: bool = True
    tensor_parallel_size: int = 1
    cpu_kvcache_space_gib: float = 1.0
    gpu_memory_utilization: float = 0.3
    cpu_expand_fix: bool = False
    draft_sample_method: str | None = None


@dataclass(frozen=True)
class RolloutConfig:
    """One rollout backend's description.

    backend: ``workbench`` | ``vllm``; drafter: the drafter section (a ``DrafterSpec``: kind,
    ``k`` = num_speculative_tokens, its method fields); sampling: temperature, top-k/p, max new
    tokens (tokens), eos and stop ids; seed: the engine's sampling seed (vLLM samples from its own
    stream; the workbench engine from the generator each call is given).
    """

    backend: str
    drafter: Any
    sampling: SamplingParams
    engine: EngineConfig = field(default_factory=EngineConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    seed: int = 0

    @property
    def k(self) -> int:
        """num_speculative_tokens (``drafter.k``; the largest k_t under a k policy)."""
        return int(self.drafter.k)
