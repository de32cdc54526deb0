"""The ``tune:`` section: `wb tune`'s Optuna search space (dotted spec key -> categorical | int | float)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from workbench.specs.sections import _Section


class CategoricalParam(_Section):
    """One of ``choices`` (str, int, float, bool or null values)."""

    type: Literal["categorical"]
    choices: list[str | bool | int | float | None] = Field(min_length=1)


class IntParam(_Section):
    """An integer in [low, high] (inclusive) on a grid of ``step``; ``log`` samples on a log scale."""

    type: Literal["int"]
    low: int
    high: int
    step: int = Field(1, ge=1)
    log: bool = False

    @model_validator(mode="after")
    def _range(self) -> "IntParam":
        if self.low > self.high:
            raise PydanticCustomError("tune_range", f"low ({self.low}) must be <= high ({self.high}); swap them")
        if self.log and (self.low < 1 or self.step != 1):
            raise PydanticCustomError("tune_range", "log: true needs low >= 1 and step 1")
        return self


class FloatParam(_Section):
    """A float in [low, high]; ``log: true`` samples on a log scale (needs low > 0)."""

    type: Literal["float"]
    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _range(self) -> "FloatParam":
        if self.low > self.high:
            raise PydanticCustomError("tune_range", f"low ({self.low}) must be <= high ({self.high}); swap them")
        if self.log and self.low <= 0:
            raise PydanticCustomError("tune_range", f"log: true needs low > 0 (got {self.low})")
        return self


ParamSpace = Annotated[Union[CategoricalParam, IntParam, FloatParam], Field(discriminator="type")]


class TuneSpec(_Section):
    """`wb tune`: an Optuna study over ``params`` (dotted spec key -> search space)."""

    study_name: str | None = Field(None, description="Optuna study name; default <spec name>-tune; re-use it to resume")
    storage: str = Field(
        "sqlite:///optuna.db", description="Optuna RDB storage: any SQLAlchemy URL (several workers may share it)"
    )
    objective: Literal["gen_tokens_per_s", "speedup_gen", "speedup_step"] = Field(
        "speedup_gen",
        description="gen/tokens_per_s, or the paired speedup (geometric mean of the per-step speedup/gen_per_step or "
        "speedup/step_per_step after warm-up)",
    )
    direction: Literal["maximize"] = "maximize"
    sampler: Literal["tpe", "random", "grid"] = Field("tpe", description="seeded by the spec's seed")
    pruner: Literal["median", "none"] = "median"
    startup_trials: int = Field(3, ge=0, description="median pruner: finished trials before any pruning")
    params: dict[str, ParamSpace] = Field(
        default_factory=dict, description="dotted spec key -> {type: categorical|int|float, ...}"
    )

    @field_validator("pruner", mode="before")
    @classmethod
    def _none_word(cls, v: Any) -> Any:
        return "none" if v is None else v  # `tune.pruner=none` parses as null

    @model_validator(mode="after")
    def _grid(self) -> "TuneSpec":
        if self.sampler == "grid":
            bad = [k for k, p in self.params.items() if isinstance(p, FloatParam)]
            if bad:
                raise ValueError(
                    f"sampler grid needs categorical or int params; {', '.join(bad)} is float (use categorical choices)"
                )
        return self


def _is_default_tune(t: "TuneSpec") -> bool:
    return t == TuneSpec()
