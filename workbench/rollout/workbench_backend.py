"""``rollout.backend=workbench``: the workbench's own speculative engine as a :class:`RolloutBackend`
(built from the rollout description by :func:`workbench.rollout_builder.build_backend`).

The engine decodes with a ``LeanLM`` copy of the policy (``target``), refreshed in place by
:meth:`WorkbenchBackend.load_policy_weights` each `prepare`, and drafts with the workbench drafter
object itself, so online adaptation's updates reach it without a reload. Its paired arm
(:meth:`WorkbenchBackend.plain_twin`) decodes with the same ``LeanLM`` and the same batch-size
buckets, so both arms run at the same captured sizes and the twin has no weights of its own to load.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch

from workbench.rollout.engine import RolloutEngine, RolloutOutput
from workbench.rollout.model import LeanLM
from workbench.rollout.sampling import SamplingParams


class WorkbenchBackend:
    """The workbench engine over ``target``.

    Args:
        target: the rollout copy of the policy (a ``LeanLM``).
        drafter: a workbench drafter, or None for plain decoding.
        k: num_speculative_tokens (the largest k_t under a k policy).
        max_batch_size, continuous, retire_buckets: as :class:`RolloutEngine`.
        compile, cuda_graphs: ``torch.compile`` the forwards, as CUDA graphs (``rollout.compile``,
            ``rollout.cuda_graphs``).
        prepack: CPU float32: the weights packed for oneDNN (``rollout.prepack_weights``,
            :meth:`RolloutEngine.enable_prepack`); ``prepack_min_rows``: its row thresholds
            (:meth:`LeanLM.enable_prepack`'s ``min_rows``).
        owns_weights: False for a twin sharing another backend's ``target``.

    Raises:
        ValueError: ``cuda_graphs`` on a target that is not on a CUDA device, ``prepack`` off CPU float32
            (each names the field).
    """

    tags: dict[str, str] = {}

    def __init__(
        self,
        target: LeanLM,
        drafter=None,
        k: int = 3,
        max_batch_size: int = 256,
        continuous: bool = True,
        retire_buckets: tuple[int, ...] | None = None,
        compile: bool = False,
        cuda_graphs: bool = False,
        owns_weights: bool = True,
        prepack: bool = False,
        prepack_min_rows=None,
    ):
        self.target, self.drafter, self.owns_weights = target, drafter, owns_weights
        self.engine = RolloutEngine(
            target, drafter, k=k, max_batch_size=max_batch_size, continuous=continuous, retire_buckets=retire_buckets
        )
        device = target.lm_head.weight.device
        if cuda_graphs and device.type != "cuda":
            raise ValueError(
                f"rollout.cuda_graphs: CUDA graphs need a CUDA device, but model.device resolved to {device}; "
                "set rollout.cuda_graphs=false (or model.device=cuda on a GPU machine)"
            )
        if compile or cuda_graphs:
            self.engine.enable_compile(cuda_graphs=cuda_graphs)
        if prepack:
            self.engine.enable_prepack(prepack_min_rows)

    def plain_twin(self) -> "WorkbenchBackend":
        """The paired arm: plain decoding with this backend's ``target`` (no weights of its own) and
        its batch-size buckets."""
        return WorkbenchBackend(
            self.target,
            None,
            max_batch_size=self.engine.max_batch_size,
            continuous=self.engine.continuous,
            retire_buckets=self.engine.retire_buckets,
            owns_weights=False,
        )

    @property
    def k_policy(self):
        return self.engine.k_policy

    @k_policy.setter
    def k_policy(self, policy) -> None:
        self.engine.k_policy = policy

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> RolloutOutput:
        return self.engine.generate(prompts, sampling, generator, group_ids)

    def generate_steps(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> Generator[None, None, RolloutOutput]:
        return self.engine.generate_steps(prompts, sampling, generator, group_ids)

    def load_policy_weights(self, policy: torch.nn.Module) -> None:
        """Copy the policy's weights into ``target`` (the drafter refreshes what it shares with it);
        nothing for a twin, whose ``target`` its owner refreshes."""
        if not self.owns_weights:
            return
        self.target.load_weights(policy)
        if self.drafter is not None:
            self.drafter.sync(self.target)

    def load_drafter_weights(self, drafter: Any) -> None:
        """Nothing to load: the engine drafts with the drafter object that online adaptation updates."""

    def close(self) -> None:
        """Nothing to free beyond what garbage collection frees."""
