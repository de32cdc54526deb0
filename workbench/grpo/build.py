"""The parts a GRPO run is built from, each by a small builder, before any MLflow run opens.

    parts = build_parts(spec)           # ranks, policy, reference, drafter, backend, optimiser, data, settings
    trainer = GRPOTrainer(parts)

As TRL's trainers take a model, a config and a dataset: the trainer (``workbench.grpo.trainer``)
runs GRPO steps on what it is handed and builds nothing itself. Order matters for reproducibility:
the builders run in the order below, so the same seed draws the same random numbers (a fresh
drafter's initial weights come from torch's global stream, after the policy's rollout copy).

Which engine generates is the rollout backend's business (``workbench.rollout.backend``): with
``rollout.backend=vllm`` no workbench engine is built, and the policy's rollout copy (a ``LeanLM``)
only where a workbench drafter needs a target (its init, an EAGLE-3 head's shared modules).
"""

from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from drafters import DrafterTarget, build_drafter, drafter_class
from drafters.chain import ChainDrafter
from drafters.training import MasterAdamW
from workbench.drafter_init import build_init
from workbench.grpo.async_rollout import check_async
from workbench.grpo.config import TrainerConfig
from workbench.grpo.distributed import DataParallel, check_distributed, launched_world_size
from workbench.grpo.online import OnlineAdaptation
from workbench.models import load_model, resolve_model
from workbench.models.chat import PromptFormat, run_prompt_format
from workbench.rollout.backend import RolloutBackend
from workbench.rollout.config import RolloutConfig
from workbench.rollout.model import LeanLM
from workbench.rollout_builder import VLLMTarget, rollout_config, rollout_target
from workbench.rollout_builder import build_backend as build_rollout_backend
from workbench.specs import ExperimentSpec
from workbench.specs.resolve import admission_config, drafter_init_config, trainer_config
from workbench.tasks import get_task
from workbench.tasks.loading import spec_task_data
from workbench.tasks.reward_funcs import check_columns, spec_reward_funcs
from workbench.vllm import admit

PAIRED_SEED_OFFSET = 1_000_003  # the paired autoregressive arm's RNG stream: seed + this


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available else cpu. Raises ValueError for an unavailable CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"model.device: {name!r} requested but CUDA is not available; use model.device=cpu or auto")
    return dev


@dataclass
class Ranks:
    """Where this process trains: its device, data-parallel ranks (None in one process), its rank."""

    device: torch.device
    dp: DataParallel | None
    rank: int

    def main_first(self):
        """Rank 0 first, then the others (building into the shared cache); a no-op in one process."""
        return self.dp.main_first() if self.dp is not None else contextlib.nullcontext()


@dataclass
class Policy:
    """The trained model, its tokenizer and folder, and the frozen reference (None when beta = 0)."""

    model: torch.nn.Module
    tokenizer: Any
    path: Path
    ref: torch.nn.Module | None


@dataclass
class DrafterParts:
    """The workbench drafter (None: none, or a kind vLLM runs without one), its init checkpoint,
    its online adaptation (None when off), and its target copy of the policy (None when unneeded)."""

    drafter: Any
    init_path: Path | None
    online: OnlineAdaptation | None
    target: LeanLM | None


@dataclass
class Optimiser:
    """The policy's optimiser, or DeepSpeed's engine that owns it (``train_engine``), and the
    module the train stage runs forwards through (``forward``: the policy, or the engine)."""

    optimizer: Any
    train_engine: Any
    forward: Any


@dataclass
class TrainerParts:
    """Everything a :class:`workbench.grpo.trainer.GRPOTrainer` trains with, and its settings (``config``)."""

    config: TrainerConfig  # seed, grpo.*, measure.drafter_drift, rollout.cuda_graphs, model.dtype
    ranks: Ranks
    policy: Policy
    drafter: DrafterParts
    backend: RolloutBackend
    paired: RolloutBackend | None  # measure.paired: a second instance of the backend, plain decoding
    optimiser: Optimiser
    rollout: RolloutConfig  # the rollout description the backends were built from (its sampling: the rollouts')
    generator: torch.Generator  # the rollouts' sampling stream: seed + rank
    paired_generator: torch.Generator  # the paired arm's: seed + PAIRED_SEED_OFFSET + rank
    task: Any
    train_data: Any
    eval_data: Any
    prompt_format: PromptFormat  # plain text or the model's chat template; its stop ids are in ``rollout.sampling``
    rewards: Any = None  # list[RewardFunc] (workbench.tasks.reward_funcs): task.reward's, or the task's own

    def close(self) -> None:
        """Free the rollout backends (idempotent)."""
        for b in (self.backend, self.paired):
            if b is not None:
                b.close()


def start_ranks(spec: ExperimentSpec) -> Ranks:
    """The device, the data-parallel ranks (``grpo.backend=deepspeed``), and the global seeds."""
    device = resolve_device(spec.model.device)
    check_distributed(spec.grpo, launched_world_size())
    dp = DataParallel.start(device.type) if spec.grpo.backend == "deepspeed" else None
    if dp is not None:
        device = dp.device(device)
    random.seed(spec.seed)
    torch.manual_seed(spec.seed)  # the same on every rank; each rank samples on its own stream
    return Ranks(device, dp, dp.rank if dp else 0)


def load_policy(spec: ExperimentSpec, device: torch.device, progress: bool = True) -> Policy:
    """The target checkpoint (built into the cache if a missing preset) as the trained policy, and
    a frozen copy of its initial weights as the KL reference when ``grpo.beta > 0`` (or to measure how
    far the policy moved, ``measure.drafter_drift``)."""
    path = resolve_model(spec.model.target, progress=progress, what="model.target")
    model, tokenizer = load_model(path, device=device, dtype=getattr(torch, spec.model.dtype))
    model.train()
    keep = spec.grpo.beta > 0 or spec.measure.drafter_drift
    ref = copy.deepcopy(model).eval().requires_grad_(False) if keep else None
    return Policy(model, tokenizer, path, ref)


def build_drafter_parts(spec: ExperimentSpec, policy: Policy, ranks: Ranks, progress: bool = True) -> DrafterParts:
    """The drafter ``wb run`` drafts with: its init (cached; trained here if missing), the drafter
    on the policy's rollout copy, and its online adaptation.

    The rollout copy (``LeanLM.from_hf``, which refuses an architecture the workbench engine does
    not run) is made when the workbench engine generates or a workbench drafter needs a target;
    with rollout.backend=vllm that is only for draft_model and eagle3, whose weights vLLM loads.

    Raises:
        ValueError: a drafter kind that cannot be adapted with ``drafter.online.enabled`` (names it).
    """
    d = spec.drafter
    on_vllm = spec.rollout.backend == "vllm"
    cls = drafter_class(d.kind)
    if on_vllm and not (cls is not None and cls.vllm_weights):  # vLLM drafts itself (ngram, suffix) or not at all
        if d.online.enabled and cls is not None:
            raise ValueError(
                f"drafter.online.enabled: drafter kind {d.kind!r} cannot be adapted; "
                "use drafter.kind=draft_model|mtp|eagle3 or drafter.online.enabled=false"
            )
        return DrafterParts(None, None, None, None)
    lm = rollout_target(policy.model, rollout_config(spec))
    init_cfg = drafter_init_config(spec)
    init_path = build_init(init_cfg, lm, policy.tokenizer, policy.path, ranks.device, progress=progress)
    drafter = build_drafter(
        d.kind,
        d,
        target=DrafterTarget(lm, policy.tokenizer, init_path=init_path, path=policy.path),
        device=ranks.device,
    )
    # (drafter none: nothing to adapt, so a sweep's autoregressive baseline may keep online.enabled)
    online = (
        OnlineAdaptation(drafter, d.online, spec.seed, reduce_grads=ranks.dp.average_grads if ranks.dp else None)
        if d.online.enabled and drafter
        else None
    )
    return DrafterParts(drafter, init_path, online, lm)


def build_backend(
    spec: ExperimentSpec,
    policy: Policy,
    drafters: DrafterParts,
    ranks: Ranks,
    vllm_tags: dict[str, str] | None = None,
    cfg: RolloutConfig | None = None,
) -> RolloutBackend:
    """The rollout backend ``rollout.backend`` names, speculating with the run's drafter
    (:func:`workbench.rollout_builder.build_backend` on the spec's rollout description ``cfg``,
    resolved here when None)."""
    cfg = cfg or rollout_config(spec, policy.tokenizer, policy.model.generation_config)
    vllm = None
    if cfg.backend == "vllm":
        # the drafter's target copy stays current only where its online training reads it (an EAGLE-3
        # head's embedding and LM head are the target's); nothing else of it is synced
        shared = drafters.target if drafters.online is not None and isinstance(drafters.drafter, ChainDrafter) else None
        vllm = VLLMTarget(
            policy.path,
            ranks.device.type,
            vllm_tags if vllm_tags is not None else admit(admission_config(spec)),
            drafters.init_path,
            drafters.target.cfg if drafters.target is not None else None,
            drafter_target=shared,
        )
    return build_rollout_backend(cfg, drafters.target, drafters.drafter, vllm)


def build_optimiser(spec: ExperimentSpec, policy: torch.nn.Module, dp: DataParallel | None) -> Optimiser:
    """float32 master weights when model.dtype is bfloat16/float16 (plain AdamW for float32);
    under DeepSpeed its engine owns the optimiser (ZeRO-sharded) and the forward."""
    g = spec.grpo
    if dp is None:
        return Optimiser(MasterAdamW(policy.parameters(), lr=g.lr, weight_decay=g.weight_decay), None, policy)
    engine = dp.wrap_policy(policy, g, spec.model.dtype, g.prompts_per_step // dp.world_size * g.group_size)
    return Optimiser(None, engine, engine)


def load_data(spec: ExperimentSpec) -> tuple[Any, Any, Any]:
    """(task, train rows, eval rows or None) for ``spec.task``."""
    t = spec.task
    train = spec_task_data(t, "train", t.num_train, spec.seed)
    evals = spec_task_data(t, "eval", t.num_eval, spec.seed) if t.num_eval else None
    return get_task(t.name), train, evals


def build_parts(spec: ExperimentSpec, progress: bool = True) -> TrainerParts:
    """Every part of a GRPO run, built (models and drafter inits built into the cache if missing).

    Raises:
        ValueError: a spec the chosen backend cannot run, an unsupported architecture, a bad
            checkpoint or data file (each names the field); ImportError: rollout.backend=vllm
            without vLLM installed (names the extra).
    """
    ranks = start_ranks(spec)
    # vLLM's admission: what it cannot run is refused before anything is built
    vllm_tags = admit(admission_config(spec)) if spec.rollout.backend == "vllm" else None
    if spec.grpo.async_.enabled:
        check_async(rollout_config(spec), spec.paired)  # the worker itself starts with the first step
    with ranks.main_first():  # rank 0 builds missing models and drafter inits into the cache
        policy = load_policy(spec, ranks.device, progress)
        drafters = build_drafter_parts(spec, policy, ranks, progress)
    # the rollout description, resolved once: sampling (eos and the prompt format's stop ids), engine options
    cfg = rollout_config(spec, policy.tokenizer, policy.model.generation_config)
    backend = build_backend(spec, policy, drafters, ranks, vllm_tags, cfg)
    # Paired measurement (docs/design.md §8): plain decoding of the same prompts with the same target
    # weights, on its own RNG stream so the speculative arm (and so training) sees the same draws
    paired = backend.plain_twin() if spec.paired else None
    optimiser = build_optimiser(spec, policy.model, ranks.dp)
    task, train, evals = load_data(spec)
    rewards = spec_reward_funcs(spec.task)  # task.reward, or the task's own; checked against the data's columns
    check_columns(rewards, train.column_names)
    # Prompts in the model's chat template when it has one (task.chat_template); its end-of-turn
    # token ends a completion in every engine (cfg.sampling.stop_token_ids)
    fmt = run_prompt_format(spec.task, policy.tokenizer)
    return TrainerParts(
        trainer_config(spec),
        ranks,
        policy,
        drafters,
        backend,
        paired,
        optimiser,
        rollout=cfg,
        generator=torch.Generator(ranks.device).manual_seed(spec.seed + ranks.rank),
        paired_generator=torch.Generator(ranks.device).manual_seed(spec.seed + PAIRED_SEED_OFFSET + ranks.rank),
        task=task,
        train_data=train,
        eval_data=evals,
        prompt_format=fmt,
        rewards=rewards,
    )
