"""Typed experiment specs: YAML in, pydantic v2 models out, command-line overrides by dotted key.

A spec is the whole description of one experiment (docs/design.md §3): which target and drafter, which
task, how rollouts are sampled, how GRPO trains, where MLflow logs. Every section forbids unknown
keys so a typo fails loudly with the field path and the keys that are allowed.
"""

from workbench.specs.dotted import flatten, set_dotted
from workbench.specs.drafter import DrafterInitSpec, DrafterOnlineSpec, DrafterSpec
from workbench.specs.experiment import ExperimentSpec
from workbench.specs.load import (
    DEFAULT_SPEC,
    EXPERIMENTS_DIR,
    apply_overrides,
    format_validation_error,
    load_spec,
    parse_override,
    read_raw_spec,
    resolve_spec_path,
    validate_spec,
)
from workbench.specs.sections import (
    GRPOSpec,
    MeasureSpec,
    ModelSpec,
    RolloutSpec,
    SpecError,
    TaskSpec,
    TrackingSpec,
)
from workbench.specs.tune import CategoricalParam, FloatParam, IntParam, ParamSpace, TuneSpec

__all__ = [
    "DEFAULT_SPEC",
    "EXPERIMENTS_DIR",
    "CategoricalParam",
    "DrafterInitSpec",
    "DrafterOnlineSpec",
    "DrafterSpec",
    "ExperimentSpec",
    "FloatParam",
    "GRPOSpec",
    "IntParam",
    "MeasureSpec",
    "ModelSpec",
    "ParamSpace",
    "RolloutSpec",
    "SpecError",
    "TaskSpec",
    "TrackingSpec",
    "TuneSpec",
    "apply_overrides",
    "flatten",
    "format_validation_error",
    "load_spec",
    "parse_override",
    "read_raw_spec",
    "resolve_spec_path",
    "set_dotted",
    "validate_spec",
]
