"""How many tokens to speculate at each verification step: the engine's hook for adaptive k.

A policy chooses k_t in 0..k before each batched verification step (0 = a plain decode step: the
drafter proposes nothing that step but still sees the emitted token in ``accept``) and is told what
the step accepted. Any choice keeps rollouts exact: rejection sampling is exact for every k_t, and
the choice depends only on earlier steps' outcomes (never on the step's own random draws).
Without a policy the engine speculates k tokens every step (vLLM's static
``num_speculative_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable
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


def expected_emitted(survival: list[float], k_t: int, draft_share: float = 1.0) -> float:
    """Expected tokens a row emits in a step at k_t: 1 + share · Σ_{i<k_t} survival[i].

    survival[i] = P(drafts 0..i all accepted) for a row that drafted (Leviathan et al. 2023, arXiv
    2211.17192: E[N] = 1 + α + ... + α^k with survival[i] = α^(i+1)); ``draft_share``: the share of
    rows that drafted at all (an n-gram or suffix drafter may find no match)."""
    return 1.0 + draft_share * sum(survival[:k_t])


def best_k(n: int, survival: list[float], draft_share: float, target_s: Callable[[float], float],
           drafter_s: Callable[[int, int], float], k_max: int) -> int:
    """The k_t in 0..k_max with the most expected tokens per second for a batch of n rows:
    n · E[N(k_t)] / (target_s(n · (k_t + 1)) + drafter_s(n, k_t)), k_t = 0 being a plain decode
    step (n / target_s(n)). Ties go to the smaller k_t."""
    def rate(k_t: int) -> float:
        secs = target_s(n * (k_t + 1)) + (drafter_s(n, k_t) if k_t else 0.0)
        return n * expected_emitted(survival, k_t, draft_share) / max(secs, 1e-12)
    return max(range(k_max + 1), key=lambda k_t: (rate(k_t), -k_t))


class AdaptiveK:
    """Adaptive speculation length (``drafter.adaptive``): before each step, the k_t in 0..k with
    the most expected tokens per second at the live batch size (:func:`best_k`), from the target's
    measured forward cost against tokens in flight, the drafter's measured cost, and running
    per-position acceptance estimates. In the spirit of batch-aware speculation control (TLT's
    adaptive drafter, vLLM's per-batch-size k): a large compute-bound batch pays for every verified
    draft, the long tail of a few rows gets drafts almost for free.

    Estimates: survival[i] = (decayed accepted-through-i counts + prior·p0^(i+1)) / (decayed counts
    of rows that drafted at position i + prior), made non-increasing in i; counts decay by ``decay``
    per step (exponential forgetting), so the prior regains weight while k_t = 0 and the policy
    returns to speculating (after at most ``probe_every`` plain steps it drafts one token anyway).

    Args:
        k_max: the largest k_t (drafter.k).
        target_s: seconds of a target forward with T tokens in flight.
        drafter_s: seconds the drafter spends per step at (n rows, k_t).
        prior: pseudo-count of the prior; p0: its per-position acceptance (optimistic by default).
    """

    def __init__(self, k_max: int, target_s: Callable[[float], float], drafter_s: Callable[[int, int], float],
                 decay: float = 0.9, prior: float = 4.0, p0: float = 0.7, probe_every: int = 8):
        self.k_max, self.target_s, self.drafter_s = k_max, target_s, drafter_s
        self.decay, self.prior, self.p0, self.probe_every = decay, prior, p0, probe_every
        self.accepted = [0.0] * k_max  # decayed rows whose drafts 0..i were all accepted
        self.reached = [0.0] * k_max  # decayed rows that drafted at position i
        self.drafted, self.rows = 0.0, 0.0  # decayed rows with >= 1 draft, rows in steps with k_t >= 1
        self.plain_steps = 0  # consecutive k_t = 0 steps

    def survival(self) -> list[float]:
        out, prev = [], 1.0
        for i in range(self.k_max):
            s = (self.accepted[i] + self.prior * self.p0 ** (i + 1)) / (self.reached[i] + self.prior)
            prev = min(prev, s)
            out.append(prev)
        return out

    def draft_share(self) -> float:
        return (self.drafted + self.prior) / (self.rows + self.prior)

    def choose(self, num_rows: int) -> int:
        k_t = best_k(num_rows, self.survival(), self.draft_share(), self.target_s, self.drafter_s, self.k_max)
        if k_t == 0 and self.plain_steps >= self.probe_every:
            k_t = 1  # keep measuring acceptance: one draft token
        return k_t

    def update(self, k_t: int, num_rows: int, num_drafts: int, accepted_per_pos: list[int]) -> None:
        self.plain_steps = self.plain_steps + 1 if k_t == 0 else 0
        d = self.decay
        self.accepted = [a * d for a in self.accepted]
        self.reached = [r * d for r in self.reached]
        self.drafted, self.rows = self.drafted * d, self.rows * d
        if k_t == 0:
            return
        self.drafted += num_drafts
        self.rows += num_rows
        for i in range(k_t):
            self.reached[i] += num_drafts  # rows with fewer drafts than k_t count as rejected past them
            self.accepted[i] += accepted_per_pos[i]
