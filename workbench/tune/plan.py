"""A `wb tune` plan: the spec with its search space, validated before anything runs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workbench import metrics as M
from workbench.specs import (
    ExperimentSpec,
    SpecError,
    TuneSpec,
    apply_overrides,
    read_raw_spec,
    set_dotted,
    validate_spec,
)
from workbench.sweep.grid import paired_by_default
from workbench.tune.space import check_params, edge_values

DEFAULT_TUNE_SPEC = "tune"
PAIRED_KEY = {
    "speedup_gen": M.SPEEDUP_GEN_PER_STEP,
    "speedup_step": M.SPEEDUP_STEP_PER_STEP,
}  # objective -> per-step paired ratio
OBJECTIVES = ("gen_tokens_per_s", *PAIRED_KEY)


@dataclass
class TunePlan:
    spec_path: str
    raw: dict[str, Any]  # spec YAML with overrides, without the tune section
    base: ExperimentSpec  # validated, tune section included
    name: str  # study name
    storage: str

    @property
    def tune(self) -> TuneSpec:
        return self.base.tune

    def trial_spec(self, params: dict[str, Any]) -> ExperimentSpec:
        raw = self.raw
        for k, v in params.items():
            raw = set_dotted(raw, k, v)
        return paired_by_default(validate_spec(raw, source="trial spec"))


def check_paired(base: ExperimentSpec) -> None:
    """A speedup objective needs paired measurement in every trial.

    Raises:
        SpecError: ``measure.paired: false`` in the spec or among the choices of ``tune.params``.
    """
    obj = base.tune.objective
    if obj not in PAIRED_KEY:
        return
    space = base.tune.params.get("measure.paired")
    if base.measure.paired is False or (space is not None and False in edge_values(space)):
        where = (
            "tune.params.measure.paired allows false"
            if space is not None and base.measure.paired is not False
            else "the spec sets measure.paired: false"
        )
        raise SpecError(
            f"tune.objective={obj} is a paired speedup, but {where}: each trial must time autoregressive generation of "
            "the same prompts in its steps. Remove measure.paired (null = on in wb tune) or set measure.paired=true, "
            "or optimize tune.objective=gen_tokens_per_s"
        )


def plan_tune(
    spec: str | None, overrides: list[str] | None = None, study_name: str | None = None, storage: str | None = None
) -> TunePlan:
    """Load the spec (default experiments/tune.yaml), apply overrides, validate the search space.

    Raises:
        SpecError: anything wrong (also an empty ``tune.params``, or ``measure.paired: false`` with a
            speedup objective), before anything runs.
    """
    path, raw = read_raw_spec(spec or DEFAULT_TUNE_SPEC)
    raw = apply_overrides(raw, overrides or [])
    base = validate_spec(raw, source=f"spec {path.name}" + (" with overrides" if overrides else ""))
    if not base.tune.params:
        raise SpecError(
            f"spec {path.name} has no search space: add a tune section, e.g.\n"
            "tune:\n  params:\n    drafter.kind: {type: categorical, choices: [ngram, draft_model]}\n    drafter.k: "
            "{type: int, low: 1, high: 6}"
        )
    raw = {k: v for k, v in raw.items() if k != "tune"}
    check_params(raw, base.tune.params)
    check_paired(base)
    name = study_name or base.tune.study_name or f"{base.name}-tune"
    return TunePlan(str(path), raw, base, name, storage or base.tune.storage)
