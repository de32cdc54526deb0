"""TRL's ``GRPOTrainer`` rolling out through the workbench's rollout backend, with any drafter.

    from trl import GRPOConfig, GRPOTrainer
    from workbench.integrations.trl import workbench_rollout_func

    rollout = workbench_rollout_func("smollm2", ["drafter.kind=eagle3", "drafter.k=3"])
    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(...), train_dataset=...,
                          rollout_func=rollout)

TRL 1.16 calls ``rollout_func(prompts, trainer)`` once per generation round with this process's
prompts, each already repeated ``num_generations`` times by its sampler (one completion per entry),
and expects ``{"prompt_ids", "completion_ids", "logprobs"}`` back; other keys reach the reward
functions. Chat templating is the rollout function's job (TRL passes conversations untouched).

What comes from where:

- **Sampling** is TRL's: ``temperature``, ``top_p``, ``top_k`` and ``max_completion_length`` of the
  ``GRPOConfig`` (as TRL's own generation uses them), stopping at TRL's ``eos_token_ids``. TRL's
  loss divides the logits by its temperature, so the rollouts must be drawn at that temperature.
  ``repetition_penalty`` and ``min_p`` change the distribution in ways the engine does not
  implement, so they are refused.
- **The engine and the drafter** are the workbench spec's ``rollout`` and ``drafter`` sections
  (``rollout.backend`` workbench or vllm, ``drafter.kind``, ``drafter.k``, packed weights...), built
  by the same builders as ``wb run`` (:mod:`workbench.grpo.build`); a drafter's init data is the
  spec's ``task``. The spec's ``model`` section is not read: the model is TRL's.
- **Weights**: the policy's current weights go into the engine before the first generation after
  each optimiser step (TRL's ``state.global_step`` moved), as ``wb run``'s `prepare` does.
- **Metrics**: TRL has no public hook for a rollout function's metrics; they are appended to the
  trainer's ``_metrics[mode]`` lists, which its ``log()`` averages and hands to every
  ``report_to`` (MLflow included): ``spec/*`` as the workbench logs them (acceptance length as
  vLLM counts it), ``timing_s/gen``, ``timing_s/prepare`` (seconds), ``gen/tokens_per_s``.

Speculation is exact (docs/design.md §4): the completions follow the policy's distribution with
any drafter; under greedy decoding they equal transformers' ``generate()`` token for token.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from workbench.grpo.build import DrafterParts, Policy, Ranks, build_backend, build_drafter_parts
from workbench.rollout.backend import RolloutBackend
from workbench.rollout.sampling import SamplingParams
from workbench.specs import ExperimentSpec, load_spec
from workbench.specs.resolve import admission_config, drafter_init_config, rollout_config
from workbench.vllm import admit

__all__ = ["WorkbenchRolloutFunc", "workbench_rollout_func", "group_ids_of"]


def workbench_rollout_func(
    spec: str | Path | ExperimentSpec = "quickstart", overrides: list[str] | None = None, progress: bool = False
) -> "WorkbenchRolloutFunc":
    """A TRL ``rollout_func`` from a workbench spec (a name under experiments/, a YAML path, or a
    loaded spec) and dotted overrides, e.g. ``["drafter.kind=ngram", "drafter.k=3"]``.

    Raises:
        SpecError: a bad spec or override (names the field).
        ValueError: ``drafter.online.enabled`` (not adapted under TRL; names the fix).
    """
    if not isinstance(spec, ExperimentSpec):
        spec = load_spec(spec, list(overrides or []))
    elif overrides:
        raise ValueError("overrides: give them with a spec name or path; a loaded ExperimentSpec is used as it is")
    return WorkbenchRolloutFunc(spec, progress=progress)


def group_ids_of(prompt_ids: list[list[int]]) -> list[int]:
    """The GRPO group of each prompt: a run of equal consecutive prompts is one group (TRL's sampler
    repeats each prompt ``num_generations`` times in a row). Groups share a prefix in the engine and
    a suffix drafter's per-group tree."""
    ids: list[int] = []
    for i, p in enumerate(prompt_ids):
        ids.append(ids[-1] if i and p == prompt_ids[i - 1] else (ids[-1] + 1 if ids else 0))
    return ids


def sampling_from_trainer(trainer: Any, sampler: str = "rejection", keyed_draft: str = "coupled") -> SamplingParams:
    """TRL's sampling settings (its ``GRPOTrainer`` attributes, copied from ``GRPOConfig``) as the
    engine's :class:`SamplingParams`, with the spec's ``rollout.sampler`` / ``rollout.keyed_draft``
    (keyed: row seeds drawn from the adapter's generator, seeded by ``GRPOConfig.seed`` and the rank,
    so the same TRL seed gives the same completions whatever the drafter).

    Raises:
        ValueError: ``repetition_penalty`` != 1 or ``min_p`` set (the engine samples the plain
            softmax with temperature, top-p and top-k only; names the field and the fix).
    """
    rp, min_p = getattr(trainer, "repetition_penalty", 1.0), getattr(trainer, "min_p", None)
    if rp not in (None, 1.0):
        raise ValueError(
            f"GRPOConfig.repetition_penalty={rp}: the workbench engine samples without a repetition "
            "penalty; set repetition_penalty=1.0 or drop rollout_func"
        )
    if min_p:
        raise ValueError(
            f"GRPOConfig.min_p={min_p}: the workbench engine has no min-p filter; set min_p=None or drop rollout_func"
        )
    eos = list(trainer.eos_token_ids)
    return SamplingParams(
        temperature=float(trainer.temperature),
        top_p=float(trainer.top_p or 1.0),
        top_k=int(trainer.top_k or 0),
        max_new_tokens=int(trainer.max_completion_length),
        eos_token_id=eos[0] if eos else None,
        stop_token_ids=tuple(eos[1:]),
        sampler=sampler,
        keyed_draft=keyed_draft,
    )


def model_folder(model: Any) -> Path:
    """The checkpoint folder of TRL's model (its ``config._name_or_path``), where a drafter init reads
    the target's config and generation config: a local folder as it is; a Hugging Face Hub id
    (``GRPOTrainer(model="Qwen/Qwen3-0.6B")``) resolved to its snapshot folder in the hub cache, as
    ``model.target`` is (:func:`workbench.models.hub.resolve_hub_model`; cached already when TRL loaded
    it); anything else (no name: a model built from a config) as a path, read only where a drafter needs it.

    Raises:
        ValueError: a Hub id that cannot be resolved (one line naming the id, the hub cache and
            ``HF_HUB_OFFLINE``).
    """
    from workbench.models.hub import parse_hub_id, resolve_hub_model

    name = str(getattr(model.config, "_name_or_path", "") or ".")
    hub = parse_hub_id(name)
    return resolve_hub_model(*hub, what="model (TRL's model.config._name_or_path)") if hub else Path(name)


def render_prompts(prompts: list, trainer: Any) -> list[list[int]]:
    """Token ids of each prompt as TRL's own generation renders it: conversations through the chat
    template with the generation prompt (and the trainer's ``chat_template_kwargs``), text as is."""
    tok = trainer.processing_class
    if prompts and isinstance(prompts[0], list):  # conversational: a list of {"role", "content"}
        out = tok.apply_chat_template(
            conversation=prompts,
            chat_template=getattr(trainer, "chat_template", None),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **(getattr(trainer, "chat_template_kwargs", None) or {}),
        )
        return [list(ids) for ids in out["input_ids"]]
    return [list(ids) for ids in tok(text=list(prompts))["input_ids"]]


class WorkbenchRolloutFunc:
    """The callable handed to ``GRPOTrainer(rollout_func=...)``; builds its backend on the first call
    (from the trainer's model), then generates with it.

    Attributes:
        spec: the workbench spec whose ``rollout`` and ``drafter`` sections it runs.
        backend: the rollout backend (None before the first call).
        drafter: the drafter parts (drafter, its init checkpoint, its target copy).
    """

    def __init__(self, spec: ExperimentSpec, progress: bool = False):
        if spec.drafter.online.enabled and spec.drafter.kind != "none":
            raise ValueError(
                "drafter.online.enabled: the TRL adapter does not adapt the drafter online (TRL owns the "
                "training loop); set drafter.online.enabled=false, or run `wb run` for online adaptation"
            )
        self.spec, self.progress = spec, progress
        self.backend: RolloutBackend | None = None
        self.drafter: DrafterParts | None = None
        self._synced_step: int | None = None
        self._path: Path | None = None  # TRL's model's checkpoint folder (model_folder), found on the first call
        self._generator: torch.Generator | None = None

    def _run_spec(self, model: torch.nn.Module, path: Path, sampling: SamplingParams) -> ExperimentSpec:
        """The spec as this run is: TRL's model (its folder and dtype) and TRL's sampling, so the vLLM
        guard judges the rollouts actually drawn (a verdict holds for its target, dtype and sampling)."""
        p = next(model.parameters())
        rollout = self.spec.rollout.model_copy(
            update={
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,
                "max_new_tokens": sampling.max_new_tokens,
            }
        )
        m = self.spec.model.model_copy(update={"target": str(path), "dtype": str(p.dtype).removeprefix("torch.")})
        return self.spec.model_copy(update={"rollout": rollout, "model": m})

    def _build(self, trainer: Any, sampling: SamplingParams) -> None:
        model = trainer.accelerator.unwrap_model(trainer.model)
        device = next(model.parameters()).device
        ranks = Ranks(device, None, trainer.accelerator.process_index)
        path = self._path = model_folder(model)
        policy = Policy(model, trainer.processing_class, path, None)
        spec = self._run_spec(model, path, sampling)
        # vLLM's guard, at TRL's sampling
        vllm_tags = admit(admission_config(spec)) if spec.rollout.backend == "vllm" else None
        cfg = rollout_config(spec, policy.tokenizer, getattr(model, "generation_config", None))
        self.drafter = build_drafter_parts(drafter_init_config(spec), cfg, spec.seed, policy, ranks, self.progress)
        self.backend = build_backend(cfg, policy, self.drafter, ranks, vllm_tags)
        self._admitted = (sampling.temperature, sampling.top_p, sampling.top_k)
        self._generator = torch.Generator(device).manual_seed(int(trainer.args.seed) + ranks.rank)
        self._synced_step = trainer.state.global_step  # the engine was just built from these weights

    def __call__(self, prompts: list, trainer: Any) -> dict[str, Any]:
        """Complete each prompt once (TRL passes each ``num_generations`` times in a row).

        Returns:
            ``prompt_ids`` / ``completion_ids`` (token ids, a list a prompt; eos included when
            emitted) and ``logprobs`` (log p of each completion token under the sampled
            distribution: the softmax of logits / temperature, after top-p / top-k; floats).
        Raises:
            ValueError: TRL settings the engine does not implement (:func:`sampling_from_trainer`),
                an architecture the engine does not run (names ``model.target``), sampled speculation
                on vLLM that no passed audit covers at TRL's sampling (the vLLM guard, docs/vllm.md), a
                model named by a Hugging Face Hub id that cannot be resolved (:func:`model_folder`).
        """
        sampling = sampling_from_trainer(trainer, self.spec.rollout.sampler, self.spec.rollout.keyed_draft)
        mode = "train" if trainer.model.training else "eval"
        metrics: dict[str, float] = {}
        t0 = time.perf_counter()
        if self.backend is None:
            self._build(trainer, sampling)
        elif (
            self.spec.rollout.backend == "vllm"
            and (sampling.temperature, sampling.top_p, sampling.top_k) != self._admitted
        ):
            model = trainer.accelerator.unwrap_model(trainer.model)  # TRL's sampling changed: the guard again
            admit(admission_config(self._run_spec(model, self._path, sampling)))
            self._admitted = (sampling.temperature, sampling.top_p, sampling.top_k)
        if trainer.state.global_step != self._synced_step:
            self.backend.load_policy_weights(trainer.accelerator.unwrap_model(trainer.model))
            self._synced_step = trainer.state.global_step
        metrics["timing_s/prepare"] = time.perf_counter() - t0
        prompt_ids = render_prompts(prompts, trainer)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.backend.generate(prompt_ids, sampling, self._generator, group_ids_of(prompt_ids))
        gen_s = time.perf_counter() - t0
        metrics["timing_s/gen"] = gen_s
        metrics["gen/tokens_per_s"] = sum(map(len, out.tokens)) / max(gen_s, 1e-9)
        metrics.update(out.counters.metrics())
        for name, value in metrics.items():
            trainer._metrics[mode][name].append(float(value))
        return {"prompt_ids": prompt_ids, "completion_ids": out.tokens, "logprobs": out.logprobs}

    def close(self) -> None:
        """Free the engine (idempotent)."""
        if self.backend is not None:
            self.backend.close()
            self.backend = None
