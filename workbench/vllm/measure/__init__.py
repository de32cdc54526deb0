"""The top floor of :mod:`workbench.vllm` (layer 3, with the other instruments): what measures vLLM.

| module | what |
|---|---|
| ``bench.py`` | ``wb bench --vllm``: our engine against vLLM's, in one process, paired per repeat |
| ``bench_transfer.py`` | its transfer columns: vLLM's cost runs (each engine step timed) and the predicted speedup's rows |
| ``transfer.py`` | pure maths (numpy, no torch, no vLLM): vLLM's speculative speedup predicted from our engine's counted steps and vLLM's step costs |
| ``audit.py`` | ``wb audit rollout.backend=vllm``: vLLM engines as audited arms, greedy identity against transformers, the verdicts recorded |

This floor's entry: the rest of the project imports the names below from here, not from the modules.
Each module is loaded on first use of one of its names (``__getattr__``), as the floors below do.
"""  # noqa: E501 (a Markdown table: one row a line)

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.vllm.runtime.lazy import lazy_getattr

if TYPE_CHECKING:  # the same names for readers and static tools; at run time __getattr__ loads them
    from workbench.vllm.measure.audit import hf_greedy_tests, record_verdicts, vllm_arms
    from workbench.vllm.measure.bench import check_predict, group_prompts, run_vllm, vllm_bench_spec, vllm_markdown
    from workbench.vllm.measure.bench_transfer import (
        predict_setting,
        predictions_markdown,
        timed_steps,
        transfer_markdown,
        transfer_row,
    )
    from workbench.vllm.measure.transfer import VLLMCosts, predicted_speedup, prediction_ci, step_costs

_LAZY = {
    "workbench.vllm.measure.audit": ("hf_greedy_tests", "record_verdicts", "vllm_arms"),
    "workbench.vllm.measure.bench": ("check_predict", "group_prompts", "run_vllm", "vllm_bench_spec", "vllm_markdown"),
    "workbench.vllm.measure.bench_transfer": (
        "predict_setting",
        "predictions_markdown",
        "timed_steps",
        "transfer_markdown",
        "transfer_row",
    ),
    "workbench.vllm.measure.transfer": ("VLLMCosts", "predicted_speedup", "prediction_ci", "step_costs"),
}
__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "hf_greedy_tests",
    "record_verdicts",
    "vllm_arms",
    "check_predict",
    "group_prompts",
    "run_vllm",
    "vllm_bench_spec",
    "vllm_markdown",
    "predict_setting",
    "predictions_markdown",
    "timed_steps",
    "transfer_markdown",
    "transfer_row",
    "VLLMCosts",
    "predicted_speedup",
    "prediction_ci",
    "step_costs",
]
