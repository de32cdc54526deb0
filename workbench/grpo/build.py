"""The parts a GRPO run is built from, each by a small builder, before any MLflow run opens.

    parts = build_parts(spec)           # workbench.run_build: the spec resolved, then these builders in order
    trainer = GRPOTrainer(parts)        # ranks, policy, reference, drafter, backend, optimiser, data, settings

As TRL's trainers take a model, a config and a dataset: the trainer (``workbench.grpo.trainer``)
runs GRPO steps on what it is handed and builds nothing itself. Each builder takes the records it
needs (sections of the spec, the rollout description, the drafter init's record), never the whole
spec; :mod:`workbench.run_build` resolves the spec and calls them. Order matters for reproducibility:
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
from workbench.drafter_init import DrafterInitConfig, build_init
from workbench.grpo.config import TrainerConfig
from workbench.grpo.distributed import DataParallel, check_distributed, launched_world_size
from workbench.grpo.online import OnlineAdaptation
from workbench.models import load_model, resolve_model
from workbench.models.chat import PromptFormat
from workbench.rollout.backend import RolloutBackend
from workbench.rollout.config import RolloutConfig
from workbench.rollout.model import LeanLM
from workbench.rollout_builder import VLLMTarget, rollout_target
from workbench.rollout_builder import build_backend as build_rollout_backend
from workbench.specs.sections import GRPOSpec, ModelSpec, TaskSpec
from workbench.tasks import get_task
from workbench.tasks.loading import spec_task_data

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


def start_ranks(device_name: str, grpo: GRPOSpec, seed: int) -> Ranks:
    """The device (``model.device``), the data-parallel ranks (``grpo.backend=deepspeed``), and the
    global seeds."""
    device = resolve_device(device_name)
    check_distributed(grpo, launched_world_size())
    dp = DataParallel.start(device.type) if grpo.backend == "deepspeed" else None
    if dp is not None:
        device = dp.device(device)
    random.seed(seed)
    torch.manual_seed(seed)  # the same on every rank; each rank samples on its own stream
    return Ranks(device, dp, dp.rank if dp else 0)


def load_policy(model_spec: ModelSpec, keep_reference: bool, device: torch.device, progress: bool = True) -> Policy:
    """The target checkpoint (``model.target``, built into the cache if a missing preset) as the trained
    policy in ``model.dtype``, and, with ``keep_reference``, a frozen copy of its initial weights (the KL
    reference when ``grpo.beta > 0``, or to measure how far the policy moved, ``measure.drafter_drift``)."""
    path = resolve_model(model_spec.target, progress=progress, what="model.target")
    model, tokenizer = load_model(path, device=device, dtype=getattr(torch, model_spec.dtype))
    model.train()
    ref = copy.deepcopy(model).eval().requires_grad_(False) if keep_reference else None
    return Policy(model, tokenizer, path, ref)


def build_drafter_parts(
    init: DrafterInitConfig, rollout: RolloutConfig, seed: int, policy: Policy, ranks: Ranks, progress: bool = True
) -> DrafterParts:
    """The drafter ``wb run`` drafts with (``init.drafter``): its init (cached; trained here if
    missing), the drafter on the policy's rollout copy (``rollout``: the run's rollout description),
    and its online adaptation (its batches drawn from ``seed``).

    The rollout copy (``LeanLM.from_hf``, which refuses an architecture the workbench engine does
    not run) is made when the workbench engine generates or a workbench drafter needs a target;
    with rollout.backend=vllm that is only for draft_model and eagle3, whose weights vLLM loads.

    Raises:
        ValueError: a drafter kind that cannot be adapted with ``drafter.online.enabled`` (names it).
    """
    d = init.drafter
    on_vllm = rollout.backend == "vllm"
    cls = drafter_class(d.kind)
    if on_vllm and not (cls is not None and cls.vllm_weights):  # vLLM drafts itself (ngram, suffix) or not at all
        if d.online.enabled and cls is not None:
            raise ValueError(
                f"drafter.online.enabled: drafter kind {d.kind!r} cannot be adapted; "
                "use drafter.kind=draft_model|mtp|eagle3 or drafter.online.enabled=false"
            )
        return DrafterParts(None, None, None, None)
    lm = rollout_target(policy.model, rollout)
    init_path = build_init(init, lm, policy.tokenizer, policy.path, ranks.device, progress=progress)
    drafter = build_drafter(
        d.kind,
        d,
        target=DrafterTarget(lm, policy.tokenizer, init_path=init_path, path=policy.path),
        device=ranks.device,
    )
    # (drafter none: nothing to adapt, so a sweep's autoregressive baseline may keep online.enabled)
    online = (
        OnlineAdaptation(drafter, d.online, seed, reduce_grads=ranks.dp.average_grads if ranks.dp else None)
        if d.online.enabled and drafter
        else None
    )
    return DrafterParts(drafter, init_path, online, lm)


def build_backend(
    cfg: RolloutConfig,
    policy: Policy,
    drafters: DrafterParts,
    ranks: Ranks,
    vllm_tags: dict[str, str] | None = None,
) -> RolloutBackend:
    """The rollout backend ``cfg.backend`` names, speculating with the run's drafter
    (:func:`workbench.rollout_builder.build_backend` on the run's rollout description ``cfg``).

    Raises:
        ValueError: rollout.backend=vllm without ``vllm_tags`` (what :func:`workbench.vllm.admit`
            returned for the run: admission comes first).
    """
    vllm = None
    if cfg.backend == "vllm":
        if vllm_tags is None:
            raise ValueError("rollout.backend=vllm: admit the run first (workbench.vllm.admit) and pass its tags")
        # the drafter's target copy stays current only where its online training reads it (an EAGLE-3
        # head's embedding and LM head are the target's); nothing else of it is synced
        shared = drafters.target if drafters.online is not None and isinstance(drafters.drafter, ChainDrafter) else None
        vllm = VLLMTarget(
            policy.path,
            ranks.device.type,
            vllm_tags,
            drafters.init_path,
            drafters.target.cfg if drafters.target is not None else None,
            drafter_target=shared,
        )
    return build_rollout_backend(cfg, drafters.target, drafters.drafter, vllm)


def build_optimiser(g: GRPOSpec, dtype: str, policy: torch.nn.Module, dp: DataParallel | None) -> Optimiser:
    """The policy's AdamW (``grpo.lr``, ``grpo.weight_decay``): float32 master weights when ``dtype``
    (``model.dtype``) is bfloat16/float16 (plain AdamW for float32); under DeepSpeed its engine owns the
    optimiser (ZeRO-sharded) and the forward."""
    if dp is None:
        return Optimiser(MasterAdamW(policy.parameters(), lr=g.lr, weight_decay=g.weight_decay), None, policy)
    engine = dp.wrap_policy(policy, g, dtype, g.prompts_per_step // dp.world_size * g.group_size)
    return Optimiser(None, engine, engine)


def load_data(t: TaskSpec, seed: int) -> tuple[Any, Any, Any]:
    """(task, train rows, eval rows or None) for the task section ``t``, drawn with ``seed``."""
    train = spec_task_data(t, "train", t.num_train, seed)
    evals = spec_task_data(t, "eval", t.num_eval, seed) if t.num_eval else None
    return get_task(t.name), train, evals
