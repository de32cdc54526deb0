"""Typed experiment specs: YAML in, pydantic v2 models out, command-line overrides by dotted key.

A spec is the whole description of one experiment (DESIGN.md §3): which target and drafter, which
task, how rollouts are sampled, how GRPO trains, where MLflow logs. Every section forbids unknown
keys so a typo fails loudly with the field path and the keys that are allowed.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic_core import PydanticCustomError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "experiments"
DEFAULT_SPEC = "quickstart"


class SpecError(ValueError):
    """A spec that cannot be loaded or validated; the message names the field and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ModelSpec(_Section):
    target: str = Field("tiny", description="target/policy: a preset name (`wb models list`) or a Hugging Face checkpoint folder")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")


class TaskSpec(_Section):
    name: str = Field("arith_chain", description="registered task: its data generator and reward verifier")
    path: str | None = Field(None, description="optional jsonl/parquet file of your own prompts; else the task's generated data")
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    num_train: int = Field(2000, ge=1)
    num_eval: int = Field(64, ge=0)


class RolloutSpec(_Section):
    backend: Literal["workbench"] = Field("workbench", description="rollout engine (vLLM hand-off planned)")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    max_new_tokens: int = Field(96, ge=1, le=4096)
    max_batch_size: int = Field(256, ge=1, description="sequences decoded together; larger batches are split")
    compile: bool = Field(
        False, description="torch.compile the engine's decode/verify forwards (target and draft model); the first "
        "steps pay the compilation (~30 s on CPU, needs a C++ compiler there)",
    )


class DrafterInitSpec(_Section):
    """Drafter initialisation (issue #3): what the drafter is trained on before the first GRPO step."""

    data: str = Field(
        "auto",
        description="auto (draft_model: none, mtp/eagle3: in_domain) | none | in_domain (the target's sampled completions "
        "of RL-task prompts) | chat (the target's completions of general-corpus prompts) | path to a jsonl/parquet of prompts",
    )
    num_prompts: int = Field(512, ge=1, description="prompts the target completes to make the init data")
    prompt_field: str = Field("prompt", description="prompt column of a user dataset")
    steps: int = Field(400, ge=0, description="optimiser steps")
    lr: float = Field(2e-3, gt=0.0, description="peak AdamW lr (warmup then cosine)")
    batch_size: int = Field(16, ge=1, description="sequences per optimiser step")

    @field_validator("data", mode="before")
    @classmethod
    def _none_word(cls, v: Any) -> Any:
        return "none" if v is None else v  # `drafter.init.data=none` parses as null


class DrafterOnlineSpec(_Section):
    """Online drafter adaptation during GRPO (the `draft_train` stage, after `train`)."""

    enabled: bool = False
    every: int = Field(1, ge=1, description="update the drafter every N GRPO steps")
    lr: float = Field(1e-3, gt=0.0)
    steps: int = Field(4, ge=1, description="optimiser steps per update")
    batch_size: int = Field(16, ge=1, description="sequences per optimiser step, drawn from the buffer")
    buffer_size: int = Field(256, ge=1, description="rollouts kept (FIFO) with their captured target states")


class DrafterSpec(_Section):
    """vLLM speculative_config vocabulary, flat, so switching `kind` by override keeps the rest valid."""

    kind: str = Field("draft_model", description="none | ngram | draft_model | mtp | eagle3 (see `drafters.DRAFTERS`)")
    k: int = Field(3, ge=1, le=16, description="num_speculative_tokens: draft tokens per verification step")
    prompt_lookup_min: int = Field(1, ge=1, description="ngram: shortest suffix to match")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: longest suffix to match")
    model: str = Field("tiny-draft", description="draft_model: preset name or checkpoint folder with the target's tokenizer")
    num_nextn_predict_layers: int = Field(1, ge=1, le=8, description="mtp: number of MTP modules D (the last one recurs for k > D)")
    eagle_aux_hidden_state_layer_ids: list[int] | None = Field(
        None, description="eagle3: target layers whose inputs are fused (low, mid, high); default (2, L//2, L-3) mapped for shallow models"
    )
    draft_vocab_size: int | None = Field(None, ge=1, description="eagle3: reduced draft vocabulary; default vocab/4 (full vocab without init data)")
    ttt_steps: int = Field(7, ge=1, le=16, description="mtp/eagle3: training-time-test unroll steps")
    ttt_decay: float = Field(0.8, gt=0.0, le=1.0, description="mtp/eagle3: weight of unroll step j is ttt_decay**j")
    init: DrafterInitSpec = Field(default_factory=DrafterInitSpec)
    online: DrafterOnlineSpec = Field(default_factory=DrafterOnlineSpec)

    @field_validator("eagle_aux_hidden_state_layer_ids")
    @classmethod
    def _three_layers(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 3 or min(v) < 0):
            raise ValueError("eagle_aux_hidden_state_layer_ids needs three layer indices >= 0 (low, mid, high), e.g. [1, 2, 3]")
        return v

    def init_data(self) -> str:
        """``init.data`` with ``auto`` resolved for this kind."""
        if self.init.data != "auto":
            return self.init.data
        return "in_domain" if self.kind in ("mtp", "eagle3") else "none"

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        from drafters import DRAFTERS

        allowed = ["none", *DRAFTERS]
        if v not in allowed:
            raise ValueError(f"unknown drafter kind {v!r}; allowed values: {', '.join(allowed)}")
        return v

    @model_validator(mode="after")
    def _lookup_range(self) -> "DrafterSpec":
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must be <= prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self


class GRPOSpec(_Section):
    steps: int = Field(10, ge=1)
    prompts_per_step: int = Field(8, ge=1)
    group_size: int = Field(8, ge=2, description="G: samples per prompt")
    lr: float = Field(1e-4, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    clip_low: float = Field(0.2, ge=0.0, description="epsilon_low of the clipped ratio")
    clip_high: float = Field(0.28, ge=0.0, description="epsilon_high (DAPO clip-higher)")
    beta: float = Field(0.0, ge=0.0, description="k3 KL coefficient to the reference model; 0 = no reference")
    loss_agg: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    scale_rewards: bool = Field(True, description="divide advantages by the group std (False = Dr. GRPO)")
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward in logprob and train")
    eval_every: int = Field(5, ge=0, description="greedy eval on held-out prompts every N steps; 0 = off")
    num_samples_logged: int = Field(4, ge=0, description="rollout samples per step kept as an MLflow artifact")


class MeasureSpec(_Section):
    """How speedups are measured (DESIGN.md §8, issue #6)."""

    paired: bool | None = Field(
        None, description="time a plain autoregressive generation of the same prompts every step, interleaved with the "
        "speculative one (outputs discarded), and log the paired speedup/gen with its CI; null = on in wb sweep and "
        "wb tune, off in wb run",
    )
    warmup_steps: int = Field(1, ge=0, description="first GRPO steps left out of means and confidence intervals")
    modeled: bool = Field(
        True, description="log speedup/gen_modeled every step of a speculative run: counted forwards × a cost curve "
        "measured once per machine and model (cached; workbench.cost_curve) before the MLflow run opens",
    )


class TrackingSpec(_Section):
    tracking_uri: str | None = Field(None, description="MLflow tracking URI; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    experiment: str = "workbench"
    run_name: str | None = None
    enabled: bool = True


# ----------------------------------------------------------------------------- tune (`wb tune`)


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
    storage: str = Field("sqlite:///optuna.db", description="Optuna RDB storage: any SQLAlchemy URL (several workers may share it)")
    objective: Literal["gen_tokens_per_s", "speedup_gen", "speedup_step"] = Field(
        "speedup_gen", description="gen/tokens_per_s, or the paired speedup (geometric mean of per-step speedup/gen or speedup/step after warm-up)"
    )
    direction: Literal["maximize"] = "maximize"
    sampler: Literal["tpe", "random", "grid"] = Field("tpe", description="seeded by the spec's seed")
    pruner: Literal["median", "none"] = "median"
    startup_trials: int = Field(3, ge=0, description="median pruner: finished trials before any pruning")
    params: dict[str, ParamSpace] = Field(default_factory=dict, description="dotted spec key -> {type: categorical|int|float, ...}")

    @field_validator("pruner", mode="before")
    @classmethod
    def _none_word(cls, v: Any) -> Any:
        return "none" if v is None else v  # `tune.pruner=none` parses as null

    @model_validator(mode="after")
    def _grid(self) -> "TuneSpec":
        if self.sampler == "grid":
            bad = [k for k, p in self.params.items() if isinstance(p, FloatParam)]
            if bad:
                raise ValueError(f"sampler grid needs categorical or int params; {', '.join(bad)} is float (use categorical choices)")
        return self


def _is_default_tune(t: "TuneSpec") -> bool:
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
    tune: TuneSpec = Field(default_factory=TuneSpec, exclude_if=_is_default_tune, description="`wb tune` search space (unused by `wb run`)")

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


# ----------------------------------------------------------------------------- helpers


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def _section_fields(path: tuple) -> list[str]:
    """Allowed keys at a spec path (tuple of field names), for error messages."""
    model: type[BaseModel] = ExperimentSpec
    for part in path:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None) if field else None
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def _field_hint(loc: tuple) -> str:
    """' (expected: int in [1, 16]; <description>)' for a spec field, from its pydantic metadata."""
    model: type[BaseModel] = ExperimentSpec
    info = None
    for part in loc:
        info = model.model_fields.get(str(part))
        if info is None:
            return ""
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
    if info is None:
        return ""
    bounds = {}
    for m in info.metadata:
        for name in ("ge", "gt", "le", "lt"):
            if getattr(m, name, None) is not None:
                bounds[name] = getattr(m, name)
    ann = info.annotation
    tname = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
    rng = ""
    if bounds:
        lo = f"[{bounds['ge']}" if "ge" in bounds else (f"({bounds['gt']}" if "gt" in bounds else "(-inf")
        hi = f"{bounds['le']}]" if "le" in bounds else (f"{bounds['lt']})" if "lt" in bounds else "inf)")
        rng = f" in {lo}, {hi}"
    desc = f"; {info.description}" if info.description else ""
    return f" [expected: {tname}{rng}{desc}]"


def format_validation_error(err: ValidationError, source: str = "spec") -> str:
    lines = [f"invalid {source}:"]
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"])
        field = ".".join(loc) or "(root)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            allowed = _section_fields(loc[:-1])
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = f" Did you mean {'.'.join(loc[:-1] + (close[0],))!r}?" if close else ""
            msg = f"unknown key.{hint} Allowed keys here: {', '.join(allowed)}"
        elif "input" in e and e["type"] not in ("missing",) and not isinstance(e["input"], dict):
            msg = msg.removeprefix("Value error, ")
            msg = f"{msg} (got {e['input']!r})" + (_field_hint(loc) if e["type"] not in ("value_error", "literal_error") else "")
        lines.append(f"  {field}: {msg}")
    return "\n".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``drafter.k=5`` -> (["drafter", "k"], 5). Values are parsed as YAML scalars/lists."""
    if "=" not in item:
        raise SpecError(f"override {item!r} must look like key=value, e.g. drafter.k=5")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise SpecError(f"override {item!r}: empty key; use a dotted key such as drafter.k")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if value is None and raw.strip().lower() not in ("null", "none", "~"):
        value = raw
    if isinstance(value, str) and value.lower() == "none" and key.split(".")[-1] != "kind":
        value = None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = copy.deepcopy(raw)
    for item in overrides:
        path, value = parse_override(item)
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise SpecError(f"override {item!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def resolve_spec_path(spec: str | Path | None) -> Path:
    """A spec argument may be a file path or the name of a spec under experiments/."""
    if spec is None:
        spec = DEFAULT_SPEC
    p = Path(spec)
    if p.is_file():
        return p
    named = EXPERIMENTS_DIR / f"{spec}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in EXPERIMENTS_DIR.glob("*.yaml"))
    raise SpecError(f"spec {str(spec)!r} not found: give a YAML file path or one of: {', '.join(names)}")


def load_spec(spec: str | Path | None = None, overrides: list[str] | None = None) -> ExperimentSpec:
    """Load a YAML spec (path or name under experiments/), apply dotted overrides, validate.

    Raises:
        SpecError: the file is missing or not YAML, an override is malformed, or validation fails;
            the message names each bad field with the allowed keys/values.
    """
    path, raw = read_raw_spec(spec)
    raw = apply_overrides(raw, overrides or [])
    return validate_spec(raw, source=f"spec {path.name}" + (" with overrides" if overrides else ""))


def read_raw_spec(spec: str | Path | None) -> tuple[Path, dict[str, Any]]:
    """(path, unvalidated mapping) of a spec file or name under experiments/.

    Raises:
        SpecError: missing file, invalid YAML, or a document that is not a mapping of sections.
    """
    path = resolve_spec_path(spec)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(f"spec {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"spec {path} must be a mapping of sections ({', '.join(ExperimentSpec.model_fields)})")
    return path, raw


def validate_spec(raw: dict[str, Any], source: str = "spec") -> ExperimentSpec:
    try:
        return ExperimentSpec.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_validation_error(e, source)) from None
