"""The parts of a GRPO run, built from its spec: the spec resolved once into its records
(:mod:`workbench.specs.resolve`, the rollout description among them), then the builders of
:mod:`workbench.grpo.build` called on them, in an order that keeps a seed's random draws the same (a
fresh drafter's initial weights come from torch's global stream, after the policy's rollout copy).

    parts = build_parts(spec)
    trainer = GRPOTrainer(parts)

The one place below the commands where the whole spec meets the builders: they, the trainer, drafter
init and vLLM's admission each read only their records (tests/test_layers.py).
"""

from __future__ import annotations

import torch

from workbench.grpo.async_rollout import check_async
from workbench.grpo.build import (
    PAIRED_SEED_OFFSET,
    TrainerParts,
    build_backend,
    build_drafter_parts,
    build_optimiser,
    load_data,
    load_policy,
    start_ranks,
)
from workbench.models.chat import run_prompt_format
from workbench.specs import ExperimentSpec
from workbench.specs.resolve import admission_config, drafter_init_config, rollout_config, trainer_config
from workbench.tasks.reward_funcs import check_columns, spec_reward_funcs
from workbench.vllm import admit


def build_parts(spec: ExperimentSpec, progress: bool = True) -> TrainerParts:
    """Every part of a GRPO run, built (models and drafter inits built into the cache if missing).

    Raises:
        ValueError: a spec the chosen backend cannot run, an unsupported architecture, a bad
            checkpoint or data file (each names the field); ImportError: rollout.backend=vllm
            without vLLM installed (names the extra).
    """
    config = trainer_config(spec)
    ranks = start_ranks(spec.model.device, spec.grpo, spec.seed)
    # vLLM's admission: what it cannot run is refused before anything is built
    vllm_tags = admit(admission_config(spec)) if spec.rollout.backend == "vllm" else None
    if spec.grpo.async_.enabled:
        check_async(rollout_config(spec), spec.paired)  # the worker itself starts with the first step
    with ranks.main_first():  # rank 0 builds missing models and drafter inits into the cache
        keep_reference = spec.grpo.beta > 0 or spec.measure.drafter_drift
        policy = load_policy(spec.model, keep_reference, ranks.device, progress)
        # the rollout description, resolved once: sampling (eos and the prompt format's stop ids), engine options
        cfg = rollout_config(spec, policy.tokenizer, policy.model.generation_config)
        drafters = build_drafter_parts(drafter_init_config(spec), cfg, spec.seed, policy, ranks, progress)
    backend = build_backend(cfg, policy, drafters, ranks, vllm_tags)
    # Paired measurement (docs/design.md §8): plain decoding of the same prompts with the same target
    # weights, on its own RNG stream so the speculative arm (and so training) sees the same draws
    paired = backend.plain_twin() if spec.paired else None
    optimiser = build_optimiser(spec.grpo, spec.model.dtype, policy.model, ranks.dp)
    task, train, evals = load_data(spec.task, spec.seed)
    rewards = spec_reward_funcs(spec.task)  # task.reward, or the task's own; checked against the data's columns
    check_columns(rewards, train.column_names)
    # Prompts in the model's chat template when it has one (task.chat_template); its end-of-turn
    # token ends a completion in every engine (cfg.sampling.stop_token_ids)
    fmt = run_prompt_format(spec.task, policy.tokenizer)
    return TrainerParts(
        config,
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
