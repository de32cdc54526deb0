"""What the GRPO trainer reads besides its built parts: one frozen record, resolved once from the spec.

As TRL's ``GRPOTrainer`` takes a ``GRPOConfig`` and never the script's arguments, the trainer
(:mod:`workbench.grpo.trainer`) never reads the experiment spec: :func:`workbench.specs.resolve.trainer_config`
fills this record from ``seed``, ``grpo.*``, ``measure.drafter_drift``, ``rollout.cuda_graphs`` and
``model.dtype``, and the builders hand it over inside :class:`workbench.grpo.build.TrainerParts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.specs.sections import GRPOSpec


@dataclass(frozen=True)
class TrainerConfig:
    """The trainer's settings.

    seed: the run's seed (the prompt order, the keyed rows' seeds, evaluation's stream seed +
    ``EVAL_SEED_OFFSET``); grpo: the GRPO hyper-parameters (:class:`workbench.specs.sections.GRPOSpec`:
    every field documented there, TRL's, verl's and NeMo RL's names accepted as aliases);
    drafter_drift: measure the frozen drafter on each step's fresh rollouts (``measure.drafter_drift``);
    cuda_graphs: the engine records CUDA graphs, so each step logs ``engine/cudagraph_skips``;
    dtype: the policy's dtype name (``float32`` | ``bfloat16`` | ``float16``: the asynchronous rollout
    worker loads its copy in it).
    """

    seed: int
    grpo: GRPOSpec
    drafter_drift: bool = False
    cuda_graphs: bool = False
    dtype: str = "float32"
