"""vLLM as the workbench runs it (``rollout.backend=vllm``; docs/design.md §11): what the workbench
adds around vLLM's engine, whose implementation of the rollout-backend interface lives in the
rollout layer (:mod:`workbench.rollout.vllm`).

| module | what |
|---|---|
| ``verdicts.py`` | the audit verdicts per (vLLM version, platform, method, sampling settings), shipped (``verdicts.json``) and the user's; the guard |
| ``build.py`` | a ``VLLMBackend`` built from a spec: checks, the guard, the workbench drafter handed to vLLM |
"""  # noqa: E501 (a Markdown table: one row a line)
