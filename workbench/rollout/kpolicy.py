"""How many tokens to speculate at each verification step: the engine's hook for adaptive k.

A policy chooses k_t in 0..k before each batched verification step (0 = a plain decode step: the
drafter proposes nothing that step but still sees the emitted token in ``accept``) and is told what
the step accepted. Any choice keeps rollouts exact: rejection sampling is exact for every k_t, and
the choice depends only on earlier steps' outcomes (never on the step's own random draws).
Without a policy the engine speculates k tokens every step (vLLM's static
``num_speculative_tokens``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class KPolicy(Protocol):
    """Chooses num_speculative_tokens per batched step (host ints; no device reads)."""

    def choose(self, num_rows: int) -> int:
        """k_t in 0..k for the next verification step of a batch of ``num_rows`` live rows."""
        ...

    def update(self, k_t: int, num_rows: int, num_drafts: int, accepted_per_pos: list[int]) -> None:
        """After a step at ``k_t``: ``num_drafts`` rows had >= 1 draft, ``accepted_per_pos`` (k_t,)
        counts the rows whose draft at position i was accepted (and emitted)."""
        ...
