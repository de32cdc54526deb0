"""The experiment spec: the whole description of one experiment (docs/design.md §3), its sections typed."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import Field, model_validator

from workbench.specs.aliases import rename_aliases
from workbench.specs.dotted import flatten
from workbench.specs.drafter import DrafterSpec
from workbench.specs.sections import (
    GRPOSpec,
    MeasureSpec,
    ModelSpec,
    RolloutSpec,
    TaskSpec,
    TrackingSpec,
    _Section,
)
from workbench.specs.tune import TuneSpec


def _is_default_tune(t: TuneSpec) -> bool:
    return t == TuneSpec()


class ExperimentSpec(_Section):
    name: str = "quickstart"
    seed: int = 0
    model: ModelSpec = Field(default_factory=ModelSpec)
    task: TaskSpec = Field(default_factory=TaskSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)
    drafter: DrafterSpec = Field(default_factory=DrafterSpec)
    grpo: GRPOSpec = Field(default_factory=GRPOSpec)
    measure: MeasureSpec = Field(default_factory=MeasureSpec)
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    tune: TuneSpec = Field(
        default_factory=TuneSpec, exclude_if=_is_default_tune, description="`wb tune` search space (unused by `wb run`)"
    )

    @model_validator(mode="before")
    @classmethod
    def _field_names(cls, data: Any) -> Any:
        """vLLM's and TRL's names for spec keys (``drafter.num_speculative_tokens``) renamed to the spec's own
        (``drafter.k``) before validation: :mod:`workbench.specs.aliases`."""
        if not isinstance(data, dict):
            return data
        return {key: rename_aliases(key, value) for key, value in data.items()}

    @property
    def paired(self) -> bool:
        """Whether each step also times autoregressive generation: never without a drafter (there is
        nothing to pair), else ``measure.paired`` (null counts as off: `wb run`'s default)."""
        return self.drafter.kind != "none" and bool(self.measure.paired)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def flat_params(self) -> dict[str, Any]:
        """Flat dotted keys (``drafter.k``) of the resolved spec, as MLflow params."""
        return flatten(self.model_dump(mode="json"))
