"""The vLLM rollout backend (``rollout.backend=vllm``; docs/design.md §11): vLLM's offline ``LLM`` in the
trainer's process, fed the trainer's weights every step, its spec-decode counters turned into the
workbench's ``spec/*`` metrics, and a guard that refuses sampled speculation on a vLLM build whose
exactness audit failed or never ran.

| module | what |
|---|---|
| ``env.py`` | importing vLLM in-process (environment, threads), the build's identity (version, platform) |
| ``config.py`` | pure: the spec -> vLLM engine arguments and ``speculative_config``; refusals naming the field |
| ``engine.py`` | :class:`VLLMEngine`: one ``LLM``, generation step by step, weight reloads, counters |
| ``backend.py`` | :class:`VLLMBackend`: what the GRPO trainer calls (speculative + paired plain engines) |
| ``verdicts.py`` | the audit verdicts per (vLLM version, platform, method), shipped and the user's; the guard |
"""

from workbench.vllm.env import vllm_missing_reason

__all__ = ["vllm_missing_reason"]
