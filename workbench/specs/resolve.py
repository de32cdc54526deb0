"""The experiment spec resolved into the typed records the layers below read (docs/architecture.md).

Nothing below :mod:`workbench.experiment` reads an ``ExperimentSpec``: each consumer takes a small
frozen record of what it needs, filled here, once per run, as vLLM's ``VllmConfig`` is split into
per-concern configs and TRL's trainer takes a ``GRPOConfig``. The rollout engine's records
(:mod:`workbench.rollout.config`) are filled by :func:`rollout_config`.
"""

from __future__ import annotations

from typing import Any

from workbench.drafter_init import DrafterInitConfig
from workbench.grpo.config import TrainerConfig
from workbench.rollout.config import RolloutConfig
from workbench.rollout_builder import describe_rollout
from workbench.specs.experiment import ExperimentSpec
from workbench.vllm import AdmissionConfig


def trainer_config(spec: ExperimentSpec) -> TrainerConfig:
    """The GRPO trainer's record: ``seed``, ``grpo.*``, ``measure.drafter_drift``, ``rollout.cuda_graphs``,
    ``model.dtype``."""
    return TrainerConfig(
        seed=spec.seed,
        grpo=spec.grpo,
        drafter_drift=spec.measure.drafter_drift,
        cuda_graphs=spec.rollout.cuda_graphs,
        dtype=spec.model.dtype,
    )


def drafter_init_config(spec: ExperimentSpec) -> DrafterInitConfig:
    """Drafter init's record: the drafter, task and rollout sections, the init's seed
    (``drafter.init.seed``, or ``seed`` when that is null), ``model.dtype``."""
    s = spec.drafter.init.seed
    return DrafterInitConfig(spec.drafter, spec.task, spec.rollout, spec.seed if s is None else s, spec.model.dtype)


def admission_config(spec: ExperimentSpec) -> AdmissionConfig:
    """vLLM admission's record (``workbench.vllm.admit``): the spec's name, ``model.target``,
    ``model.dtype``, the rollout, drafter and grpo sections."""
    return AdmissionConfig(spec.name, spec.model.target, spec.model.dtype, spec.rollout, spec.drafter, spec.grpo)


def rollout_config(
    spec: ExperimentSpec, tokenizer=None, generation_config: Any = None, max_new_tokens: int | None = None
) -> RolloutConfig:
    """The rollout description of ``spec`` (:func:`workbench.rollout_builder.describe_rollout` of its
    ``rollout``, ``drafter`` and ``task`` sections, ``model.dtype`` and ``seed``). With ``tokenizer``,
    completions end at its eos and the prompt format's stop ids; without, generation is fixed-length.
    ``max_new_tokens`` (tokens): overrides ``rollout.max_new_tokens``."""
    return describe_rollout(
        spec.rollout, spec.drafter, spec.task, spec.model.dtype, spec.seed, tokenizer, generation_config, max_new_tokens
    )
