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

from workbench.rollout.cost import best_k, expected_emitted, modeled_step_s


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

    # Optional: ``observe(k_t, num_rows, seconds)``, the step's measured wall time (the engine calls
    # it when the policy has it; seconds from the step's start to its end, host read included).


def size_bin(n: int) -> int:
    """Power-of-two bin of a batch size: rows in (b/2, b] -> b."""
    return 1 << max(n - 1, 0).bit_length()


class AdaptiveK:
    """Adaptive speculation length (``drafter.adaptive``): before each step, the k_t in 0..k with
    the most expected tokens per second at the live batch size (:func:`best_k`), from the target's
    measured forward cost against tokens in flight, the drafter's measured cost, and running
    per-position acceptance estimates. In the spirit of batch-aware speculation control (TLT's
    adaptive drafter, vLLM's per-batch-size k): a large compute-bound batch pays for every verified
    draft, the long tail of a few rows gets drafts almost for free.

    Estimates: survival[i] = (decayed accepted-through-i counts + prior·p0^(i+1)) / (decayed counts
    of rows that drafted at position i + prior), made non-increasing in i; counts decay by ``decay``
    per speculative step (exponential forgetting). A plain step (k_t = 0) says nothing about
    acceptance and leaves them as they are; instead, after ``probe_every`` plain steps in a row the
    policy drafts one token (a probe), and each probe that does not bring speculation back doubles
    the interval (up to ``max_probe_every``): a drafter that does not pay costs ever less to watch.
    A probe is made only where it is cheap, a k_t = 1 step costing at most ``probe_max_cost`` more
    than a plain step (in the long tail, not in a compute-bound full batch): measured on the
    quickstart, probes at batch 64 cost 9 % of the generation.

    Step times are measured, not only modeled: the engine reports each step's wall time
    (:meth:`observe`), and the cost curves' seconds for (n, k_t) are scaled by the measured /
    modeled ratio of that k_t in that batch-size bin (an exponential average; the bin's plain
    step's ratio where that k_t has none yet), so what the curves leave out (sampling, the
    drafter's bookkeeping, Python) enters the choice. The first step at each batch-size bin is a
    plain one, so every comparison is anchored at a measured plain step of that size (the ratio
    varies with the batch size: fixed per-step costs weigh more in the tail). The first speculative
    step after plain ones (or at a new batch) is a switch: its drafter catches up once on what the
    plain steps emitted (draft_model's and the chain's lazy prefill, suffix's tries), a cost of the
    switch, not of every step at that k_t. Its excess over the expected step is kept apart
    (``switch_s``, an exponential average) and a switch is made only where the expected savings of
    the steps the batch has left repay it (:meth:`steps_left`: learned from earlier batches, how
    many steps a batch spends at each batch-size bin), a probe only where it stays cheap with it.
    The choice then depends on the machine's timing: still exact (k_t depends only on earlier
    steps), but not reproducible bit for bit across runs.

    The choice for a batch size is cached, recomputed after every speculative step (new acceptance
    counts) and every ``refresh`` steps (the measured ratios drift slowly): best_k costs ~30 us, 1.5 %
    of a 2 ms plain step of the quickstart on the 2-core CPU.

    Args:
        k_max: the largest k_t (drafter.k).
        target_s: seconds of a target forward with T tokens in flight.
        drafter_s: seconds the drafter spends per step at (n rows, k_t).
        prior: pseudo-count of the prior; p0: its per-position acceptance (optimistic by default).
        probe_max_cost: the most a probe step may cost over a plain step (0.25 = 25 %).
        refresh: steps after which a cached choice is recomputed.
        switch_horizon: the steps left assumed before a first batch has been seen whole.
        measured: use the measured step times (False: the cost curves alone, reproducible).
        time_weight: weight of a new measurement in the exponential average of the ratios.
        margin: the expected gain over plain decoding a k_t > 0 needs (0.1 = 10 %). Why: per-step
            tokens per second overstate what speculation saves a batch (its longest row sets the
            generation's length, and a row's accepted tokens vary), and near break-even the
            estimates' noise decides; measured on the quickstart, break-even by the model was a
            0.88x generation.
    """

    def __init__(
        self,
        k_max: int,
        target_s: Callable[[float], float],
        drafter_s: Callable[[int, int], float],
        decay: float = 0.9,
        prior: float = 4.0,
        p0: float = 0.7,
        probe_every: int = 8,
        max_probe_every: int = 128,
        measured: bool = True,
        time_weight: float = 0.2,
        margin: float = 0.1,
        probe_max_cost: float = 0.25,
        refresh: int = 16,
        switch_horizon: int = 8,
    ):
        self.k_max, self.target_s, self.drafter_s = k_max, target_s, drafter_s
        self.probe_max_cost, self.refresh, self.switch_horizon = probe_max_cost, refresh, switch_horizon
        self.switch_s: float | None = None  # seconds a switch costs over its expected step (None: not measured yet)
        # rows -> (best k_t, seconds it saves per step, a probe's extra seconds, a plain step's seconds)
        self._memo: dict[int, tuple[int, float, float, float]] = {}
        self._since_refresh = 0
        self._modeled: dict[tuple[int, int], float] = {}
        self._prev = (0, 0)  # (k_t, rows) of the last choice
        self._switch = False  # the chosen step is the first speculative one after plain steps
        self.steps_at: dict[int, float] = {}  # size bin -> steps a batch spends there (average over batches)
        self._batch_steps: dict[int, int] = {}  # the same, this batch so far
        self.decay, self.prior, self.p0, self.probe_every = decay, prior, p0, probe_every
        self.max_probe_every, self.measured, self.time_weight, self.margin = (
            max_probe_every,
            measured,
            time_weight,
            margin,
        )
        self.accepted = [0.0] * k_max  # decayed rows whose drafts 0..i were all accepted
        self.reached = [0.0] * k_max  # decayed rows that drafted at position i
        self.drafted, self.rows = 0.0, 0.0  # decayed rows with >= 1 draft, rows in steps with k_t >= 1
        self.plain_steps = 0  # consecutive k_t = 0 steps
        self.interval = probe_every  # plain steps before the next probe
        self.ratio: dict[tuple[int, int], float] = {}  # (size bin, k_t) -> measured / modeled step seconds
        self.ratio_k: dict[int, float] = {}  # k_t -> the same over all bins

    def survival(self) -> list[float]:
        out, prev = [], 1.0
        for i in range(self.k_max):
            s = (self.accepted[i] + self.prior * self.p0 ** (i + 1)) / (self.reached[i] + self.prior)
            prev = min(prev, s)
            out.append(prev)
        return out

    def draft_share(self) -> float:
        return (self.drafted + self.prior) / (self.rows + self.prior)

    def scale(self, num_rows: int, k_t: int) -> float:
        """Measured / modeled step seconds for (n, k_t): its bin's; else the bin's plain step's (the
        curves' relative costs, anchored at this batch size's measured plain step); else the k_t's
        over all bins; else 1."""
        b = size_bin(num_rows)
        return self.ratio.get((b, k_t), self.ratio.get((b, 0), self.ratio_k.get(k_t, 1.0)))

    def modeled(self, num_rows: int, k_t: int) -> float:
        """:func:`modeled_step_s` of (n, k_t), cached (the curves are fixed; an interpolation costs ~5 us)."""
        key = (num_rows, k_t)
        if key not in self._modeled:
            self._modeled[key] = modeled_step_s(num_rows, k_t, self.target_s, self.drafter_s)
        return self._modeled[key]

    def step_s(self, num_rows: int, k_t: int) -> float:
        """Expected seconds of a step of ``num_rows`` rows at ``k_t``: the curves, times the measured ratio."""
        secs = self.modeled(num_rows, k_t)
        return secs * self.scale(num_rows, k_t) if self.measured else secs

    def steps_left(self, num_rows: int) -> float:
        """Steps the batch has left at ``num_rows`` live rows: the average steps earlier batches
        spent at this size bin (less those spent here already) and at every smaller one;
        ``switch_horizon`` before a batch has been seen whole."""
        if not self.steps_at:
            return float(self.switch_horizon)
        b = size_bin(num_rows)
        here = max(self.steps_at.get(b, 0.0) - self._batch_steps.get(b, 0), 0.0)
        return max(here + sum(v for bin_, v in self.steps_at.items() if bin_ < b), 1.0)

    def _count_step(self, num_rows: int) -> None:
        """Count the step in its size bin; at a new batch (more rows than before) fold the last
        batch's counts into ``steps_at`` (bins it skipped count 0)."""
        if num_rows > self._prev[1] and self._batch_steps:
            w = self.time_weight
            for b in set(self.steps_at) | set(self._batch_steps):
                n = self._batch_steps.get(b, 0)
                self.steps_at[b] = n if b not in self.steps_at else (1 - w) * self.steps_at[b] + w * n
            self._batch_steps = {}
        b = size_bin(num_rows)
        self._batch_steps[b] = self._batch_steps.get(b, 0) + 1

    def choose(self, num_rows: int) -> int:
        self._count_step(num_rows)
        k_t = self._choose(num_rows)
        self._switch = k_t > 0 and self._switching(num_rows)
        self._prev = (k_t, num_rows)
        return k_t

    def _switching(self, num_rows: int) -> bool:
        """Whether speculating now is a switch: after a plain step, or at a new batch (more rows than before)."""
        prev_k, prev_n = self._prev
        return prev_k == 0 or num_rows > prev_n

    def _choose(self, num_rows: int) -> int:
        if self.measured and (size_bin(num_rows), 0) not in self.ratio:
            return 0  # a batch size not seen yet: first measure what plain decoding costs at it
        if self._since_refresh >= self.refresh:
            self._memo, self._since_refresh = {}, 0
        if num_rows not in self._memo:
            surv, share = self.survival(), self.draft_share()
            k_best = best_k(
                num_rows,
                surv,
                share,
                self.target_s,
                self.drafter_s,
                self.k_max,
                self.scale if self.measured else None,
                self.margin,
            )
            plain = self.step_s(num_rows, 0)
            saved = expected_emitted(surv, k_best, share) * plain - self.step_s(num_rows, k_best)  # per step, seconds
            probe_extra = self.step_s(num_rows, 1) - plain if self.k_max else float("inf")
            self._memo[num_rows] = (k_best, saved, probe_extra, plain)
        k_t, saved, probe_extra, plain = self._memo[num_rows]
        switch_s = (self.switch_s or 0.0) if self.measured else 0.0  # (unmeasured: the first switch measures it)
        if k_t > 0 and self._switching(num_rows) and self.steps_left(num_rows) * saved < switch_s:
            k_t = 0  # the catch-up would cost more than speculation saves in what is left of the batch
        if k_t > 0:
            self.interval = self.probe_every  # speculation pays again: back to the base interval
        elif self.plain_steps >= self.interval and probe_extra + switch_s <= self.probe_max_cost * plain:
            k_t = 1  # keep measuring acceptance: one draft token
            self.interval = min(2 * self.interval, self.max_probe_every)
        return k_t

    def observe(self, k_t: int, num_rows: int, seconds: float) -> None:
        """The measured wall time of a step of ``num_rows`` rows at ``k_t`` (seconds)."""
        self._since_refresh += 1
        modeled = self.modeled(num_rows, k_t)
        switch, self._switch = self._switch, False
        if modeled <= 0 or seconds <= 0:
            return
        w = self.time_weight
        if k_t > 0 and switch:  # its excess over the expected step is the drafter's one-off catch-up
            excess = max(seconds - self.step_s(num_rows, k_t), 0.0)
            self.switch_s = excess if self.switch_s is None else (1 - w) * self.switch_s + w * excess
            self._memo = {}
            return
        r = seconds / modeled
        for table, key in ((self.ratio, (size_bin(num_rows), k_t)), (self.ratio_k, k_t)):
            table[key] = r if key not in table else (1 - w) * table[key] + w * r

    def update(self, k_t: int, num_rows: int, num_drafts: int, accepted_per_pos: list[int]) -> None:
        if k_t == 0:  # no evidence about acceptance: the estimates stay
            self.plain_steps += 1
            return
        self.plain_steps = 0
        self._memo = {}  # new acceptance counts: choose afresh
        d = self.decay
        self.accepted = [a * d for a in self.accepted]
        self.reached = [r * d for r in self.reached]
        self.drafted, self.rows = self.drafted * d, self.rows * d
        self.drafted += num_drafts
        self.rows += num_rows
        for i in range(k_t):
            self.reached[i] += num_drafts  # rows with fewer drafts than k_t count as rejected past them
            self.accepted[i] += accepted_per_pos[i]
