"""Step counts of a batch that sheds finished rows, and the measured cost of one engine step.

Pure functions (numpy), used by ``wb simulate --from-sweep`` (:mod:`workbench.perf.simulate.from_sweep`,
:mod:`workbench.perf.simulate.cpu`), ``speedup/gen_modeled`` (:mod:`workbench.perf.modeled`) and
``wb bench``'s predicted speedup (:func:`batch_predicted_speedup`).

- Acceptance: a drafted row emits E[N] = 1 + Σ_i r_i tokens per verification step, r_i the
  per-position acceptance rates (accepts form a prefix, so P(emit ≥ i+2) = r_i); no geometric α.
- Steps: a batch runs until its slowest row has its tokens (rows leave as they finish), so its
  verification steps are E[max over rows], not tokens / E[N] (Leviathan et al. 2023 is per row).
- Cost: an affine fit a + b·n of seconds against rows in flight (:func:`fit_affine`); the
  drafter's own seconds per verification step (:class:`DrafterCost`, measured by
  :mod:`workbench.perf.cost_curve`).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from workbench.perf.analytic import CostModel
from workbench.rollout.cost import tokens_per_step


def emit_pmf(per_pos: list[float], no_draft: float = 0.0) -> np.ndarray:
    """P(one verification step emits j+1 tokens), j = 0..k, from per-position rates (accepts form a
    prefix, so P(accepted ≥ i+1) = r_i) and the share of row-steps without a draft (they emit 1)."""
    r = np.minimum.accumulate(np.clip(np.asarray(per_pos, dtype=float), 0.0, 1.0)) if len(per_pos) else np.zeros(0)
    ge = np.concatenate([[1.0], r, [0.0]])  # P(accepted >= j), j = 0..k+1
    p = (ge[:-1] - ge[1:]) * (1.0 - no_draft)
    p[0] += no_draft
    return p / p.sum()


def simulate_steps(
    lengths: list[int], pmf: np.ndarray | list[float], reps: int = 64, seed: int = 0
) -> tuple[float, float]:
    """(verification steps S, row-steps R) of one batch whose rows generate ``lengths`` tokens.

    The prefill emits each row's first token; a row then takes steps, each emitting j+1 tokens with
    probability pmf[j], until it has its length; finished rows leave the batch, so the batch runs
    for S = max over rows of the row's steps. Means over ``reps`` fixed-seed draws (pmf = [1]: the
    autoregressive S = max(L) − 1, R = Σ (L − 1), exactly).
    """
    rem = np.asarray(lengths, dtype=np.int64) - 1
    rem = rem[rem > 0]
    if rem.size == 0:
        return 0.0, 0.0
    pmf = np.asarray(pmf, dtype=float)
    if pmf.size == 1 or pmf[0] >= 1.0:
        return float(rem.max()), float(rem.sum())
    T = int(rem.max())
    reps = max(4, min(reps, 4_000_000 // (rem.size * T)))
    rng = np.random.default_rng(seed)
    emits = rng.choice(pmf.size, size=(reps, rem.size, T), p=pmf / pmf.sum()) + 1
    steps = (emits.cumsum(-1) < rem[None, :, None]).sum(-1) + 1  # draws until the row has its length
    return float(steps.max(1).mean()), float(steps.sum(1).mean())


def slot_schedule(steps: list[int] | np.ndarray, slots: int) -> tuple[int, np.ndarray]:
    """Continuous batching (Orca, Yu et al. OSDI 2022): rows taking ``steps[i]`` forwards each join,
    in order, the first of ``slots`` batch slots to free up (a row of 0 steps finished at its
    prefill and holds none). Returns (forwards the batch runs, (N,) the forward each row starts at)."""
    free = [0] * max(int(slots), 1)  # per slot: the forward it frees at (a heap)
    starts = np.zeros(len(steps), dtype=np.int64)
    end = 0
    for i, s in enumerate(steps):
        if s <= 0:
            starts[i] = free[0]
            continue
        t = heapq.heappop(free)
        starts[i] = t
        heapq.heappush(free, t + int(s))
        end = max(end, t + int(s))
    return end, starts


def simulate_steps_continuous(
    lengths: list[int], pmf, slots: int, reps: int = 64, seed: int = 0
) -> tuple[float, float]:
    """:func:`simulate_steps` for a batch of ``slots`` rows batched continuously: each row's steps
    drawn as there, the batch's forwards = the :func:`slot_schedule` of them (means over ``reps``)."""
    rem = np.asarray(lengths, dtype=np.int64) - 1
    if rem.size == 0 or rem.max() <= 0:
        return 0.0, 0.0
    pmf = np.asarray(pmf, dtype=float)
    if pmf.size == 1 or pmf[0] >= 1.0:
        return float(slot_schedule(np.maximum(rem, 0), slots)[0]), float(np.maximum(rem, 0).sum())
    T = int(rem.max())
    reps = max(4, min(reps, 4_000_000 // (rem.size * T)))
    emits = np.random.default_rng(seed).choice(pmf.size, size=(reps, rem.size, T), p=pmf / pmf.sum()) + 1
    steps = np.where(rem[None, :] > 0, (emits.cumsum(-1) < rem[None, :, None]).sum(-1) + 1, 0)  # (reps, N)
    return float(np.mean([slot_schedule(s, slots)[0] for s in steps])), float(steps.sum(1).mean())


def batch_steps(
    batches: list[list[int]], chunk: int, pmf, reps: int = 64, seed: int = 0, continuous: bool = False
) -> tuple[float, float]:
    """Mean (S, R) per GRPO step over sampled batches; a batch larger than ``chunk`` rows
    (rollout.max_batch_size) runs as consecutive chunks, whose S and R add up, or, ``continuous``
    (rollout.continuous_batching), in ``chunk`` slots that waiting rows fill as rows finish."""
    out = []
    for b in batches:
        if continuous and len(b) > chunk:
            out.append(simulate_steps_continuous(b, pmf, chunk, reps, seed))
            continue
        parts = [simulate_steps(b[i : i + chunk], pmf, reps, seed + i) for i in range(0, len(b), max(chunk, 1))]
        out.append((sum(p[0] for p in parts), sum(p[1] for p in parts)))
    return float(np.mean([o[0] for o in out])), float(np.mean([o[1] for o in out]))


def batch_predicted_speedup(
    counters, rates: list[float], B: int, max_new_tokens: int, k: int, c: float, verify_cost: float
) -> float | None:
    """Predicted speedup of a fixed-length batch: the Leviathan per-step cost (k·c + cost(k+1), in
    target steps) times the batch's verification steps S, against the autoregressive max_new_tokens-1.

    A batch runs until its slowest row has its tokens, so S is the expected *maximum* over the B
    rows of their steps, simulated from the measured per-position acceptance rates (and the share
    of row-steps without a draft, e.g. n-gram misses) with :func:`simulate_steps`;
    per-row E[N] alone (Leviathan et al.) overstates a batch's speedup.
    """
    if counters.num_drafts == 0 or max_new_tokens < 2:
        return None
    emitted = counters.num_generated_tokens - B  # the prefill emits each row's first token
    undrafted = max(0.0, emitted - counters.num_drafts * tokens_per_step(rates))
    no_draft = undrafted / (counters.num_drafts + undrafted)
    S, _ = simulate_steps([max_new_tokens] * B, emit_pmf(rates, no_draft), reps=256)
    return (max_new_tokens - 1) / (S * (k * c + verify_cost))


def fit_affine(ns: list[float], seconds: list[float]) -> tuple[float, float]:
    """Least-squares a + b·n through (n, seconds), with a, b ≥ 0 (a noisy fit is clipped, the other refitted)."""
    x, y = np.asarray(ns, dtype=float), np.asarray(seconds, dtype=float)
    if x.size == 1 or np.ptp(x) == 0:
        return float(max(y.mean(), 0.0)), 0.0
    b, a = np.polyfit(x, y, 1)
    if a < 0:
        return 0.0, float(max((x * y).sum() / (x * x).sum(), 0.0))
    if b < 0:
        return float(max(y.mean(), 0.0)), 0.0
    return float(a), float(b)


@dataclass
class DrafterCost:
    """Seconds the drafter spends per verification step (all k draft steps) at n rows in flight."""

    kind: str
    k: int
    how: str  # what was measured (shown in docs / tables)
    curve: CostModel | None = None  # draft_model: the draft model's forward curve
    a: float = 0.0  # otherwise a + b·n seconds per verification step
    b: float = 0.0

    def step(self, n: float) -> float:
        return self.step_at(n, self.k)

    def step_at(self, n: float, k_t: int) -> float:
        """Seconds per verification step at n rows drafting k_t tokens: draft_model from its curve,
        d(2n) + (k_t-1)·d(n); the others' measured a + b·n (at k) scaled by k_t / k (per-draft cost
        assumed constant: an approximation for ngram and suffix, whose match cost barely depends on k)."""
        if k_t <= 0:
            return 0.0
        if self.curve is not None:
            return self.curve.time(2 * n) + (k_t - 1) * self.curve.time(n)
        return (self.a + self.b * n) * k_t / max(self.k, 1)
