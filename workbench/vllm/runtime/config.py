"""The rollout description -> vLLM's engine and sampling arguments (pure; no vLLM import).

What vLLM cannot run from a workbench spec is refused a floor up, before anything is built
(:mod:`workbench.vllm.speculative`, which also writes ``speculative_config``).
"""

from __future__ import annotations

from typing import Any

from workbench.rollout.config import VLLMConfig

GiB = 1 << 30


def engine_kwargs(v: VLLMConfig, device_type: str, seed: int) -> dict[str, Any]:
    """``LLM(**kwargs)`` for the described engine (the model folder is added by the caller).

    logprobs_mode ``processed_logprobs``: the log-probs of the distribution sampled from (after
    temperature, top-k, top-p), the quantity the workbench engine returns and the trainer compares
    (``gen/logprob_abs_diff``). CPU: the KV cache is sized in bytes from ``cpu_kvcache_space_gib``.
    """
    kw: dict[str, Any] = {
        "dtype": v.dtype,
        "seed": seed,
        "enforce_eager": v.enforce_eager,
        "max_num_seqs": v.max_num_seqs,
        "tensor_parallel_size": v.tensor_parallel_size,
        "disable_log_stats": False,  # the spec-decode counters come from its stat loggers
        "logprobs_mode": "processed_logprobs",
    }
    if device_type == "cpu":
        kw["kv_cache_memory_bytes"] = int(v.cpu_kvcache_space_gib * GiB)
    else:
        kw["gpu_memory_utilization"] = v.gpu_memory_utilization
    return kw


def sampling_kwargs(sampling, seed: int | None, logprobs: bool = True) -> dict[str, Any]:
    """``vllm.SamplingParams(**kwargs)`` from the workbench's ``SamplingParams`` (temperature 0 = greedy;
    top_k 0 = off, vLLM's -1 / 0). ``seed``: the request's own seed (reproducible per row)."""
    kw: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k or 0,
        "max_tokens": sampling.max_new_tokens,
        "seed": seed,
        "detokenize": False,
    }
    if sampling.stop_ids:  # eos and the chat template's end-of-turn ids (SamplingParams.stop_ids)
        kw["stop_token_ids"] = list(sampling.stop_ids)
    else:  # fixed-length generation (benchmarks): the workbench engine's eos_token_id=None
        kw["ignore_eos"] = True
    if logprobs:
        kw["logprobs"] = 0  # the sampled token's log-prob only
    return kw
