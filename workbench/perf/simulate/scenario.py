"""A ``wb simulate`` scenario: typed sections (pydantic, unknown keys refused), YAML loading, dotted overrides.

Sections: ``model`` (a preset, a Hugging Face ``config.json`` or explicit shape), ``drafter_model``
(draft_model only), ``hardware``, ``cluster``, ``gen`` (generation parallelism and per-forward
overheads), ``workload``, ``speculation``, ``train``, ``async``, ``calibration``, ``reference``
(published or measured seconds to compare with) and ``variants`` (named sets of dotted overrides of
the base: RL-Zero, RL-Think). Units: seconds, bytes, bytes/s, FLOP/s, tokens.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from drafters import draft_cost_of
from workbench.perf.simulate.presets import HARDWARE_PRESETS, MODEL_PRESETS, model_from_hf_config
from workbench.specs.dotted import set_dotted
from workbench.specs.load import apply_overrides
from workbench.specs.sections import SpecError

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "scenarios"  # package data (specs.load)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _with_preset(data: Any, presets: dict[str, dict[str, Any]], what: str) -> Any:
    """Preset values under the explicitly given ones (``preset: qwen3-8b`` then any field overrides)."""
    if not isinstance(data, dict) or data.get("preset") is None:
        return data
    name = str(data["preset"]).lower()
    if name not in presets:
        raise ValueError(f"unknown {what} preset {data['preset']!r}; one of: {', '.join(presets)}")
    return {**presets[name], **data}


class ModelShape(_Section):
    """A decoder-only transformer (dense, or MoE when ``experts`` > 0)."""

    preset: str | None = Field(None, description=f"one of {', '.join(MODEL_PRESETS)}")
    hf_config: str | None = Field(None, description="a Hugging Face config.json to read the shape from")
    layers: int = Field(..., ge=1)
    hidden: int = Field(..., ge=1)
    intermediate: int = Field(..., ge=1, description="dense MLP width (unused by MoE layers)")
    heads: int = Field(..., ge=1)
    kv_heads: int = Field(..., ge=1)
    head_dim: int = Field(..., ge=1)
    vocab: int = Field(..., ge=1)
    experts: int = Field(0, ge=0, description="routed experts per layer; 0 = dense")
    experts_per_token: int = Field(0, ge=0)
    moe_intermediate: int = Field(0, ge=0)
    tied_embeddings: bool = False
    bytes_per_param: float = Field(2.0, gt=0, description="weight bytes (bf16: 2)")
    kv_bytes: float = Field(2.0, gt=0, description="bytes per KV-cache element (bf16: 2, fp8: 1)")
    total_params: float | None = Field(None, gt=0, description="override of the count from the shape")
    active_params: float | None = Field(None, gt=0, description="override: parameters one token uses")

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("hf_config"):
            try:
                data = {**model_from_hf_config(data["hf_config"]), **data}
            except (OSError, ValueError) as e:
                raise ValueError(f"hf_config: {e}") from None
        return _with_preset(data, MODEL_PRESETS, "model")

    @model_validator(mode="after")
    def _moe(self) -> "ModelShape":
        if self.experts and not (1 <= self.experts_per_token <= self.experts and self.moe_intermediate >= 1):
            raise ValueError("an MoE model needs 1 <= experts_per_token <= experts and moe_intermediate >= 1")
        return self


class Hardware(_Section):
    """One GPU (datasheet numbers) and the achieved fractions of them."""

    preset: str | None = Field(None, description=f"one of {', '.join(HARDWARE_PRESETS)}")
    flops: float = Field(..., gt=0, description="dense bf16 tensor FLOP/s per GPU")
    hbm_bandwidth: float = Field(..., gt=0, description="HBM bytes/s per GPU")
    hbm_bytes: float = Field(..., gt=0, description="HBM capacity per GPU, bytes")
    link_bandwidth: float = Field(..., gt=0, description="NVLink bytes/s per GPU per direction")
    gpus_per_node: int = Field(..., ge=1, description="GPUs one NVLink domain joins")
    scaleout_bandwidth: float = Field(50e9, gt=0, description="bytes/s per GPU between NVLink domains (400 Gb/s NIC)")
    flops_efficiency: float = Field(0.6, gt=0, le=1, description="achieved fraction of peak FLOP/s in decode/verify")
    bandwidth_efficiency: float = Field(0.8, gt=0, le=1, description="achieved fraction of HBM bandwidth")
    collective_latency_s: float = Field(5e-6, ge=0, description="fixed seconds per collective (all-reduce, all-to-all)")

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, data: Any) -> Any:
        return _with_preset(data, HARDWARE_PRESETS, "hardware")


class Cluster(_Section):
    gpus: int = Field(..., ge=1, description="GPUs of the whole job (generation and training)")


class Gen(_Section):
    """Generation: replicas of ``tp`` GPUs (vLLM tensor_parallel_size); replicas = generating GPUs / tp."""

    tp: int = Field(1, ge=1, description="GPUs per generation replica (tensor parallel)")
    ep: int = Field(
        1, ge=1, description="MoE: 1 = experts tensor-sharded, = tp: experts spread over the replica (all-to-all)"
    )
    max_num_seqs: int = Field(256, ge=1, description="rows in flight per replica at most (vLLM max_num_seqs)")
    memory_utilization: float = Field(0.9, gt=0, le=1, description="share of HBM vLLM takes (gpu_memory_utilization)")
    step_overhead_s: float = Field(0.0, ge=0, description="fixed seconds per target forward (schedule, sample, launch)")
    draft_overhead_s: float | None = Field(
        None, ge=0, description="fixed seconds per drafter forward; null = step_overhead_s"
    )
    sampler_bytes: float = Field(
        0.0,
        ge=0,
        description="HBM bytes per vocabulary entry per sampled position (target logits in fp32 "
        "through vLLM's sampler / rejection sampler: workbench.perf.simulate.costs.sampler_s); 0 = not modelled",
    )

    @property
    def draft_overhead(self) -> float:
        return self.step_overhead_s if self.draft_overhead_s is None else self.draft_overhead_s

    @model_validator(mode="after")
    def _ep(self) -> "Gen":
        if self.ep not in (1, self.tp):
            raise ValueError(f"gen.ep must be 1 or equal gen.tp ({self.tp}): experts live inside one replica")
        return self


class Response(_Section):
    """Response lengths (tokens), rows grouped by prompt, cut at ``max``: ``lognormal`` with ``mean``, ``cv``
    and within-prompt correlation ``icc``; ``lengths``, a list resampled row by row; or ``run``, a workbench
    run's logged lengths resampled prompt by prompt (:mod:`workbench.perf.simulate.lengths`)."""

    kind: Literal["lognormal", "lengths", "run"] = "lognormal"
    mean: float = Field(2000.0, gt=0)
    cv: float = Field(0.8, ge=0)
    icc: float = Field(0.0, ge=0, le=1, description="lognormal: correlation of log lengths within a prompt's G samples")
    max: int = Field(8192, ge=1, description="max_tokens: longer samples are cut here")
    lengths: list[int] = Field(default_factory=list, description="kind lengths: measured completion lengths, resampled")
    run: list[str] = Field(
        default_factory=list,
        description="kind run: run ids, run names or sweep names whose logged lengths are resampled",
    )
    tracking_uri: str | None = Field(None, description="kind run: the MLflow store (default: the workbench's)")
    scale_mean: float | None = Field(
        None,
        gt=0,
        description="kind run: rescale the measured lengths to this mean before the cut at max "
        "(rows the run cut at its max_new_tokens land at that times the scale; null: as measured)",
    )

    @field_validator("run", mode="before")
    @classmethod
    def _run_ids(cls, v: object) -> object:
        if isinstance(v, (int, float)):  # an all-digit id read as a YAML number
            v = str(v)
        return [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v

    @model_validator(mode="after")
    def _lengths(self) -> "Response":
        if self.kind == "lengths" and not self.lengths:
            raise ValueError("kind: lengths needs a non-empty lengths list (a workbench run's completion lengths)")
        if self.kind == "run" and not self.run:
            raise ValueError(
                "kind: run needs workload.response.run: the MLflow run id(s) of a `wb run` (it logs "
                "completions/lengths/)"
            )
        return self


class Workload(_Section):
    prompts: int = Field(512, ge=1, description="prompts per step")
    group_size: int = Field(16, ge=1, description="G samples per prompt")
    prompt_len: int = Field(256, ge=1, description="prompt tokens")
    response: Response = Field(default_factory=Response)
    seed: int = 0


class Speculation(_Section):
    """The drafter and its acceptance: exactly one of ``alpha``, ``per_position`` or ``acceptance_length``."""

    drafter: Literal["none", "eagle3", "mtp", "draft_model", "ngram"] = "eagle3"
    k: int = Field(3, ge=1, description="draft tokens per verification step")
    k_scan: list[int] = Field(default_factory=lambda: list(range(1, 8)), description="k values searched for the best k")
    alpha: float | None = Field(None, ge=0, le=1, description="per-token acceptance: position i accepted with α^(i+1)")
    per_position: list[float] | None = Field(None, description="P(draft position i accepted), i = 0.. (vLLM counters)")
    acceptance_length: dict[int, float] | None = Field(
        None, description="measured tokens per verification step at each k"
    )
    draft_layers: int = Field(1, ge=1, description="eagle3/mtp: decoder layers of the head")
    draft_vocab: int | None = Field(32000, ge=1, description="eagle3: reduced draft vocabulary; null = target's")
    ngram_step_s: float = Field(0.0, ge=0, description="ngram: host seconds per proposal step")
    ngram_ns_per_token: float = Field(
        0.0,
        ge=0,
        description="ngram: host nanoseconds per context token scanned by one thread "
        "(vLLM's NgramProposer scans every live row's tokens each step); 0 = not modelled",
    )
    ngram_threads: int = Field(
        1, ge=1, description="ngram: threads the scan runs on (vLLM: max(1, cpu_count // 2 // tp))"
    )
    acceptance_vs_context: dict[int, float] | None = Field(
        None,
        description="a drafter's acceptance length measured at each context length (tokens), at "
        "acceptance_vs_context_k draft tokens: its long-context decay, shape only (workbench.perf.simulate.context); "
        "null = acceptance independent of context",
    )
    acceptance_vs_context_k: int = Field(
        3, ge=1, description="draft tokens the acceptance_vs_context table was measured with"
    )

    @model_validator(mode="after")
    def _acceptance(self) -> "Speculation":
        given = [x is not None for x in (self.alpha, self.per_position, self.acceptance_length)]
        if self.drafter != "none" and sum(given) != 1:
            raise ValueError(
                "give exactly one of speculation.alpha, speculation.per_position or speculation.acceptance_length"
            )
        if self.acceptance_vs_context is not None:
            t = self.acceptance_vs_context
            if (
                not t
                or any(c < 0 for c in t)
                or any(not 1.0 <= v <= self.acceptance_vs_context_k + 1 for v in t.values())
            ):
                raise ValueError(
                    "speculation.acceptance_vs_context: {context tokens: acceptance length in [1, k+1]}, at least "
                    "one entry"
                )
            if self.per_position is not None:
                raise ValueError(
                    "speculation.acceptance_vs_context scales alpha or acceptance_length; with per_position give "
                    "per-position rates at one context only (drop acceptance_vs_context)"
                )
            if self.acceptance_length is not None and len(self.acceptance_length) > 1:
                raise ValueError(
                    "speculation.acceptance_vs_context fits one short-context α to one measured k: give "
                    "speculation.acceptance_length at a single k"
                )
        return self


class Train(_Section):
    mfu: float = Field(0.4, gt=0, le=1, description="model FLOP utilisation of the policy update")
    logprob_mfu: float = Field(0.3, gt=0, le=1, description="model FLOP utilisation of the logprob forward")
    reference: bool = Field(False, description="logprob also runs the reference policy (β > 0)")
    data_s: float = Field(0.0, ge=0, description="seconds of the data stage (given)")
    prepare_s: float = Field(0.0, ge=0, description="seconds of the prepare stage: weight sync (given)")


class Async(_Section):
    staleness: int = Field(0, ge=0, description="0 = synchronous (colocated); s >= 1: generator up to s steps ahead")
    gen_fraction: float = Field(0.5, gt=0, lt=1, description="s >= 1: share of the GPUs that generate (the rest train)")
    cv: float = Field(0.1, ge=0, description="coefficient of variation of the per-step gen time")


class Calibration(_Section):
    unknown: Literal["none", "bandwidth_efficiency", "flops_efficiency", "step_overhead_s", "draft_overhead_s"] = "none"
    variant: str | None = Field(None, description="the variant measured (null: the base scenario)")
    arm: Literal["autoregressive", "speculative"] = "autoregressive"
    gen_s: float = Field(1.0, gt=0, description="the measured gen seconds per step of that variant and arm")

    @field_validator("unknown", mode="before")
    @classmethod
    def _none(cls, v: object) -> object:
        return "none" if v is None else v  # `calibration.unknown=none` on the command line reads as null


class Scenario(_Section):
    name: str = "scenario"
    model: ModelShape
    drafter_model: ModelShape | None = Field(None, description="draft_model: the drafter's shape")
    hardware: Hardware
    cluster: Cluster
    gen: Gen = Field(default_factory=Gen)
    workload: Workload = Field(default_factory=Workload)
    speculation: Speculation = Field(default_factory=lambda: Speculation(alpha=0.7))
    train: Train = Field(default_factory=Train)
    async_: Async = Field(default_factory=Async, alias="async")
    calibration: Calibration = Field(default_factory=Calibration)
    reference: dict[str, float] = Field(
        default_factory=dict,
        description="published/measured values at every k: gen_ar, step_ar, "
        "and (for the scenario's own k) gen_spec, step_spec, speedups",
    )
    reference_by_k: dict[int, dict[str, float]] = Field(
        default_factory=dict,
        description="published/measured values at one speculation.k (gen_spec, step_spec, gen_speedup, ...): "
        "compared with rows simulated at that k, and gen_speedup with the k scan's speedup at that k",
    )
    reference_by_gpus: dict[int, dict[str, float]] = Field(
        default_factory=dict,
        description="published values at one cluster.gpus (e.g. the 235B projection's 512- and 2,048-GPU "
        "speedups): compared with rows simulated at that GPU count; they win over reference on a clash",
    )
    variants: dict[str, dict[str, Any]] = Field(default_factory=dict, description="name -> {dotted key: value}")
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    @field_validator("variants")
    @classmethod
    def _flat(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, over in v.items():
            if not isinstance(over, dict):
                raise ValueError(f"variant {name!r} must map dotted keys to values")
        return v

    @model_validator(mode="after")
    def _fit(self) -> "Scenario":
        if self.cluster.gpus < self.gen.tp:
            raise ValueError(f"cluster.gpus ({self.cluster.gpus}) is below one replica (gen.tp = {self.gen.tp})")
        if draft_cost_of(self.speculation.drafter) == "model" and self.drafter_model is None:
            raise ValueError(
                f"speculation.drafter {self.speculation.drafter} needs drafter_model (e.g. preset: qwen3-0.6b)"
            )
        return self


# ------------------------------------------------------------------ loading


def _allowed(model: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    for part in loc:
        f = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        ann = getattr(f, "annotation", None)
        ann = next((a for a in getattr(ann, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return [f.alias or n for n, f in model.model_fields.items()]


def format_error(err: ValidationError, source: str) -> str:
    """One line per bad field (dotted path), unknown keys with a 'did you mean' and the allowed keys
    (the style of :func:`workbench.specs.load.format_validation_error`)."""
    lines = [f"invalid {source}:"]
    for e in err.errors():
        loc = tuple(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            allowed = _allowed(Scenario, loc[:-1])
            close = difflib.get_close_matches(loc[-1], allowed, n=1)
            hint = f" Did you mean {'.'.join(loc[:-1] + (close[0],))!r}?" if close else ""
            msg = f"unknown key.{hint} Allowed keys here: {', '.join(allowed)}"
        elif "input" in e and e["type"] not in ("missing", "value_error") and not isinstance(e["input"], dict):
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  {'.'.join(loc) or '(root)'}: {msg}")
    return "\n".join(lines)


def resolve_scenario_path(scenario: str | Path) -> Path:
    """A file path, or a name under experiments/scenarios/ (``qwen3-8b-gb200``)."""
    p = Path(scenario)
    if p.is_file():
        return p
    named = SCENARIOS_DIR / f"{scenario}.yaml"
    if named.is_file():
        return named
    names = sorted(x.stem for x in SCENARIOS_DIR.glob("*.yaml"))
    raise SpecError(f"scenario {str(scenario)!r} not found: give a YAML file or one of: {', '.join(names)}")


def read_raw(scenario: str | Path) -> dict[str, Any]:
    """The unvalidated mapping of a scenario file; relative ``hf_config`` paths resolve against the file."""
    path = resolve_scenario_path(scenario)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise SpecError(f"scenario {path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"scenario {path} must be a mapping of sections ({', '.join(_allowed(Scenario, ()))})")
    for sec in ("model", "drafter_model"):
        hf = (raw.get(sec) or {}).get("hf_config") if isinstance(raw.get(sec), dict) else None
        if hf and not Path(hf).is_absolute():
            raw = set_dotted(raw, f"{sec}.hf_config", str((path.parent / hf).resolve()))
    raw.setdefault("name", path.stem)
    return raw


def validate(raw: dict[str, Any], source: str = "scenario") -> Scenario:
    try:
        return Scenario.model_validate(raw)
    except ValidationError as e:
        raise SpecError(format_error(e, source)) from None


def variant_raw(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """The base mapping with variant ``name``'s dotted overrides set (variants themselves dropped)."""
    variants = raw.get("variants") or {}
    if name not in variants:
        raise SpecError(f"variant {name!r} not in the scenario; its variants: {', '.join(variants) or '(none)'}")
    out = {k: v for k, v in raw.items() if k != "variants"}
    for key, value in variants[name].items():
        out = merge_dotted(out, key, value)
    return out


def merge_dotted(raw: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """:func:`set_dotted`, except that a mapping of named keys merges into the mapping already there
    (recursively), so ``workload: {response: {cv: 1.2}}`` and ``workload.response.cv: 1.2`` mean the
    same. A mapping with a non-string key is a table (``acceptance_length: {3: 2.47}``) and replaces
    the base's table whole: a variant's measured k = 3 must not inherit the base drafter's k = 5."""
    if isinstance(value, dict) and value and all(isinstance(sub, str) for sub in value):
        node: Any = raw
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            for sub, v in value.items():
                raw = merge_dotted(raw, f"{key}.{sub}", v)
            return raw
    return set_dotted(raw, key, value)


def load_scenario(scenario: str | Path, overrides: list[str] | None = None) -> tuple[dict[str, Any], Scenario]:
    """(raw mapping with overrides, validated base scenario). Each variant is validated too.

    Raises:
        SpecError: missing file, bad YAML, a malformed override, or a field that fails validation
            (the message names it, with the allowed keys).
    """
    raw = apply_overrides(read_raw(scenario), overrides or [], aliases=False)
    src = f"scenario {raw.get('name')}" + (" with overrides" if overrides else "")
    base = validate(raw, src)
    for name in base.variants:
        validate(variant_raw(raw, name), f"{src}, variant {name}")
    return raw, base
