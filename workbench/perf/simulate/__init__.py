"""``wb simulate``: project speculative and asynchronous RL to the models and clusters users train on.

One concept per module, pure maths apart from reading YAML:

- :mod:`~workbench.perf.simulate.presets`: model shapes (Qwen3-8B, Qwen3-235B-A22B, any HF ``config.json``)
  and GPUs (H100, H200, B200, GB200) from their published numbers;
- :mod:`~workbench.perf.simulate.scenario`: the typed scenario, YAML and dotted overrides;
- :mod:`~workbench.perf.simulate.costs`: one forward on a replica, term by term (weights, KV cache,
  attention, MoE experts touched, TP/EP communication);
- :mod:`~workbench.perf.simulate.rollout`: the gen stage (continuous batching, the long tail, KV capacity,
  verification and drafter steps);
- :mod:`~workbench.perf.simulate.step`: logprob, train, the synchronous and asynchronous step, best k;
- :mod:`~workbench.perf.simulate.run`: calibration of one unknown, variants, sweep grids;
- :mod:`~workbench.perf.simulate.plots`: speedup vs k, e2e speedup vs GPUs and staleness, a sweep check;
- :mod:`~workbench.perf.simulate.measured`: the machine a sweep ran on as the hardware (cached cost curves);
- :mod:`~workbench.perf.simulate.from_sweep`: a sweep in MLflow as workload, acceptance and measurements;
- :mod:`~workbench.perf.simulate.cpu`: ``--from-sweep``: one unknown fitted at one k, every other k predicted;
- :mod:`~workbench.perf.simulate.record`: the MLflow run of every ``wb simulate``.
"""

from workbench.perf.simulate.run import ALIASES, Fit, Row, calibrate, run, solve_monotone
from workbench.perf.simulate.scenario import Scenario, load_scenario
from workbench.perf.simulate.step import StepResult, simulate

__all__ = [
    "ALIASES",
    "Fit",
    "Row",
    "Scenario",
    "StepResult",
    "calibrate",
    "load_scenario",
    "run",
    "simulate",
    "solve_monotone",
]
