"""The rollout-backend interface: what the GRPO trainer, the paired timer, `wb audit` and `wb bench`
call to generate rollouts, whichever engine generates them (``rollout.backend``).

Two implementations, each in its own place on the rollout layer's floor:

| ``rollout.backend`` | class | where |
|---|---|---|
| ``workbench`` | :class:`workbench.rollout.workbench_backend.WorkbenchBackend` | the workbench's own speculative engine (:mod:`workbench.rollout.engine`) over a ``LeanLM`` copy of the policy |
| ``vllm`` | :class:`workbench.vllm.runtime.VLLMBackend` | vLLM's offline engine in this process (:mod:`workbench.vllm.runtime`) |

A step (docs/design.md §3): ``load_policy_weights(policy)`` in `prepare` (and
``load_drafter_weights(drafter)`` after online adaptation changed the drafter), then
``generate(prompts, sampling, generator, group_ids)`` in `gen`. Paired timing (docs/design.md §8)
runs a second instance of the same backend without a drafter, the two advanced forward by forward
through ``generate_steps`` (:func:`workbench.rollout.paired.generate_interleaved`).

Counters: every generation returns its own :class:`workbench.rollout.counters.SpecCounters` in
``RolloutOutput.counters`` (drafts, draft tokens, accepted tokens per position, rows per forward),
the same fields from both backends, so ``spec/*`` means the same on both.
"""  # noqa: E501 (a Markdown table: one row a line)

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol, runtime_checkable

import torch

from workbench.rollout.engine import RolloutOutput, drain
from workbench.rollout.sampling import SamplingParams

__all__ = ["RolloutBackend", "RolloutOutput", "drain"]


@runtime_checkable
class RolloutBackend(Protocol):
    """A rollout engine the trainer can feed weights and ask for completions.

    Attributes:
        owns_weights: False for a paired arm that decodes with the weights of the backend it was
            made beside (the workbench engine's arms share one ``LeanLM``): ``load_policy_weights``
            is then a no-op and is not timed.
        tags: MLflow run tags the backend adds (vLLM: its build and audit verdict); {} if none.
        k_policy: adaptive speculation's per-step k policy (``workbench.rollout.kpolicy``), None =
            the drafter's fixed k. Backends without one keep None and refuse another value.
    """

    owns_weights: bool
    tags: dict[str, str]
    k_policy: Any

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> RolloutOutput:
        """Complete every prompt (token ids) once; outputs in prompt order. ``generator``: the
        sampling stream (a backend that samples from its own seeded stream ignores it);
        ``group_ids``: the GRPO group of each prompt (prompts of a group share a prefix)."""
        ...

    def generate_steps(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        generator: torch.Generator | None = None,
        group_ids: list[int] | None = None,
    ) -> Generator[None, None, RolloutOutput]:
        """:meth:`generate` yielding after every batched forward (engine step); returns the output."""
        ...

    def load_policy_weights(self, policy: torch.nn.Module) -> None:
        """The policy's current weights (Hugging Face names) into the engine, in place."""
        ...

    def load_drafter_weights(self, drafter: Any) -> None:
        """The (adapted) workbench drafter's weights into the engine's drafter; a no-op where the
        engine drafts with the drafter object itself."""
        ...

    def plain_twin(self) -> "RolloutBackend":
        """A second instance of this backend decoding without a drafter: the paired arm."""
        ...

    def close(self) -> None:
        """Free the engine (idempotent)."""
        ...
