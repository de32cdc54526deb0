"""The performance model of speculative rollouts in a GRPO step (``wb project``, ``speedup/gen_modeled``).

One concept per module; pure maths apart from what measures or reads runs. E[N], the α fits, the
step cost n·(k+1) + drafter, the gen speedup and the best k are :mod:`workbench.rollout.cost`'s, the one
module of the cost maths, shared with the engine's adaptive k (its names are re-exported here).

- :mod:`~workbench.perf.analytic`: the cost of a target forward
  (constant, roofline, measured curve), Leviathan gen speedup, synchronous and asynchronous step
  (``wb project --gen ...`` / ``--run``);
- :mod:`~workbench.perf.seeds`: the model against docs/design.md §6's published stage times (``--seeds``);
- :mod:`~workbench.perf.calibrate`: one measured point fixes one unknown cost (``--calibrate``);
- :mod:`~workbench.perf.steps`: steps of a batch that sheds finished rows, affine fits, drafter costs,
  ``wb bench``'s batch prediction;
- :mod:`~workbench.perf.sweep_runs`: runs read through :mod:`workbench.runs` (the one MLflow reader);
- :mod:`~workbench.perf.cost_curve`, :mod:`~workbench.perf.modeled`: cached forward-cost curves and
  the deterministic ``speedup/gen_modeled`` every speculative run logs (docs/design.md §8);
- :mod:`workbench.perf.simulate`: ``wb simulate``, the cluster simulator, and the one check of the
  model against a measured sweep (``wb simulate --from-sweep``; ``wb project --sweep`` is its alias).
  Not imported here; its command resolves the sweep with the report (:mod:`workbench.report`) and hands it over.

vLLM's speculative speedup predicted from the workbench's counted steps (``wb bench --vllm``'s transfer
columns) lives with everything vLLM: :mod:`workbench.vllm.measure.transfer`.

The names below are re-exported; :mod:`~workbench.perf.cost_curve` (which imports torch) is loaded
on first use of one of its names, so ``wb project --seeds`` does not pay for torch.
"""

from __future__ import annotations

import importlib

from workbench.perf.analytic import (
    CostModel,
    Projection,
    async_overlap,
    async_step_time,
    best_per_drafter,
    load_cost_curve,
    project,
    roofline_time,
    step_speedup,
)
from workbench.perf.calibrate import Calibration, alpha_from_inputs, fit_c, fit_knee, predict_speedup
from workbench.perf.modeled import ModeledSpeedup, build_modeled, modeled_metrics
from workbench.perf.seeds import SEEDS, STEP_SPEEDUP_TOLERANCE, PublishedSeed, SeedCheck, check_seed, seeds_check
from workbench.perf.steps import (
    batch_predicted_speedup,
    batch_steps,
    emit_pmf,
    fit_affine,
    simulate_steps,
)
from workbench.perf.sweep_runs import SweepRun, spec_from_params, stages_from_mlflow
from workbench.rollout.cost import (
    alpha_from_acceptance_length,
    alpha_from_per_position,
    expected_tokens,
    fit_alpha,
    gen_speedup,
    tokens_per_step,
)

_LAZY = {
    name: "workbench.perf.cost_curve"
    for name in ("DrafterCost", "drafter_cost", "forward_curve", "measure_forward_curve")
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'workbench.perf' has no attribute {name!r}")


__all__ = [
    "CostModel",
    "Projection",
    "alpha_from_acceptance_length",
    "alpha_from_per_position",
    "fit_alpha",
    "async_overlap",
    "async_step_time",
    "best_per_drafter",
    "expected_tokens",
    "gen_speedup",
    "load_cost_curve",
    "project",
    "roofline_time",
    "step_speedup",
    "Calibration",
    "alpha_from_inputs",
    "fit_c",
    "fit_knee",
    "predict_speedup",
    "ModeledSpeedup",
    "build_modeled",
    "modeled_metrics",
    "SEEDS",
    "STEP_SPEEDUP_TOLERANCE",
    "PublishedSeed",
    "SeedCheck",
    "check_seed",
    "seeds_check",
    "batch_predicted_speedup",
    "batch_steps",
    "emit_pmf",
    "fit_affine",
    "simulate_steps",
    "tokens_per_step",
    "SweepRun",
    "spec_from_params",
    "stages_from_mlflow",
    *_LAZY,
]
