"""The workbench from Python: what ``wb run``, ``wb sweep`` and ``wb report`` do, as functions.

    import workbench as wb
    spec = wb.load_spec("quickstart", ["drafter.kind=ngram", "grpo.steps=2"])   # or a YAML path
    result = wb.run(spec)                          # one GRPO run logged to MLflow: RunResult
    sweep = wb.sweep("micro", ["drafter=ngram,draft_model", "k=1,3"], name="my-sweep")
    target, files = wb.report("my-sweep", html=True)
    chosen = wb.export("my-sweep")                 # vLLM / NeMo RL / verl / TRL settings of its best point

``workbench.sweep`` and ``workbench.report`` are packages too: each is callable as its function
(:func:`workbench.sweep.run.sweep`, :func:`workbench.report.write.report`), so ``from workbench import sweep``
gives the same callable however it is reached. Every function logs to the MLflow store the CLI uses
(``tracking.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` in the working directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.report.export_point import export_point as export
from workbench.report.write import report
from workbench.specs import ExperimentSpec, load_spec, validate_spec
from workbench.sweep.run import sweep

if TYPE_CHECKING:
    from workbench.experiment import RunResult

__all__ = ["load_spec", "load_spec_from", "run", "sweep", "report", "export"]


def _spec(spec: str | Path | dict[str, Any] | ExperimentSpec | None, overrides: list[str] | None) -> ExperimentSpec:
    if isinstance(spec, ExperimentSpec):
        return load_spec_from(spec.model_dump(mode="json", by_alias=True), overrides) if overrides else spec
    if isinstance(spec, dict):
        return load_spec_from(spec, overrides)
    return load_spec(spec, overrides)


def load_spec_from(raw: dict[str, Any], overrides: list[str] | None = None) -> ExperimentSpec:
    """A spec from a mapping (the YAML's shape; vLLM's/TRL's key names accepted), dotted overrides applied.

    Raises:
        SpecError: a bad key, type or value, naming the field.
    """
    from workbench.specs import apply_overrides

    return validate_spec(
        apply_overrides(raw, overrides or []), source="spec" + (" with overrides" if overrides else "")
    )


def run(
    spec: str | Path | dict[str, Any] | ExperimentSpec | None = None,
    overrides: list[str] | None = None,
    progress: bool = False,
) -> RunResult:
    """Run one GRPO experiment (``wb run``): ``spec.grpo.steps`` steps, every metric logged to MLflow.

    spec: a shipped spec's name, a YAML path, a mapping or an :class:`ExperimentSpec` (None: quickstart);
    overrides: dotted ``key=value`` strings. Returns the run's id, store and per-step metric history.

    Raises:
        SpecError: a bad spec; ValueError: bad input found while preparing (checkpoint, data file, reward),
            after the MLflow run is marked FAILED; whatever the trainer raises, likewise.
    """
    from rich.console import Console

    from workbench.experiment import run_experiment

    return run_experiment(_spec(spec, overrides), console=Console(quiet=not progress), progress=progress)
