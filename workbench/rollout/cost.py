"""The cost maths of speculative decoding, in one place: tokens per verification step, the step's
cost, the gen speedup and the best k.

Pure functions of host floats (no torch), on the ground floor so the engine's adaptive-k policy
(:mod:`workbench.rollout.kpolicy`), the projections and calibration (:mod:`workbench.perf`) and
``wb simulate`` all use the same formulas. Seconds throughout; a "decode step" is one target
forward with one token per row.

- Tokens per verification step (Leviathan et al. 2023, arXiv 2211.17192): a drafted row emits
  E[N] = 1 + Σ_{i<k} s_i tokens, s_i = P(drafts 0..i all accepted) (accepts form a prefix, so s_i is
  also the per-position acceptance rate r_i). Under the independence assumption s_i = α^(i+1) and
  E[N] = (1 − α^(k+1)) / (1 − α).
- Step cost: the target's forward with n · (k + 1) tokens in flight plus the drafter's k steps.
- Gen speedup: S = E[N] / (k · c + v), c a drafter step and v a verification, both in decode steps.
- Best k: the k with the most expected tokens per second; ties go to the smaller k.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

# ------------------------------------------------------------------ tokens per verification step


def expected_emitted(survival: Sequence[float], k_t: int, draft_share: float = 1.0) -> float:
    """Expected tokens a row emits in a step at k_t: 1 + share · Σ_{i<k_t} survival[i].

    survival[i] = P(drafts 0..i all accepted) for a row that drafted; ``draft_share``: the share of
    rows that drafted at all (an n-gram or suffix drafter may find no match)."""
    return 1.0 + draft_share * sum(survival[:k_t])


def tokens_per_step(per_pos: Sequence[float]) -> float:
    """E[N] = 1 + Σ_i r_i: tokens one verification step emits for a drafted row (bonus or correction
    token included), from per-position acceptance rates r_i = P(draft position i accepted)."""
    return 1.0 + float(sum(per_pos))


def expected_tokens(alpha: float, k: int) -> float:
    """E[N] = (1 − α^(k+1)) / (1 − α): tokens per verification step (bonus included) with i.i.d.
    per-token acceptance α (Leviathan et al. 2023); k + 1 at α = 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


# ------------------------------------------------------------------ acceptance α


def alpha_from_per_position(rates: Sequence[float]) -> float:
    """α fitting r_i ≈ α^(i+1): log α = Σ (i+1) log r_i / Σ (i+1)^2 (zero rates are skipped)."""
    pts = [(i + 1, math.log(r)) for i, r in enumerate(rates) if r > 0]
    if not pts:
        return 0.0
    return min(math.exp(sum(w * lr for w, lr in pts) / sum(w * w for w, _ in pts)), 1.0)


def fit_alpha(rates_per_pos: Sequence[float]) -> float | None:
    """α fitted to per-position acceptance rates r_i ≈ α^(i+1) (:func:`alpha_from_per_position`);
    None when no position was ever accepted."""
    return alpha_from_per_position(rates_per_pos) if any(r > 0 for r in rates_per_pos) else None


def alpha_from_acceptance_length(length: float, k: int) -> float:
    """α with E[N](α, k) = ``length`` (bisection, 60 halvings; length in [1, k+1])."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < length else (lo, mid)
    return (lo + hi) / 2


# ------------------------------------------------------------------ the step's cost and the speedup


def modeled_step_s(
    n: int | float, k_t: int, target_s: Callable[[float], float], drafter_s: Callable[[int, int], float]
) -> float:
    """Seconds of one step of n rows at k_t from the cost curves: the target's forward with
    n · (k_t + 1) tokens in flight plus the drafter's k_t steps (none at k_t = 0, a plain decode)."""
    return target_s(n * (k_t + 1)) + (drafter_s(n, k_t) if k_t else 0.0)


def knee_verify_ratio(k: int, batch: int, knee: float | None) -> float:
    """v(k) = max(1, B·(k+1)/T_knee) / max(1, B/T_knee): a verification in decode steps when the
    forward is memory-bound up to T_knee tokens in flight and compute-bound past it; ``knee`` None
    or ∞: 1 (memory-bound)."""
    if knee is None or math.isinf(knee):
        return 1.0
    return max(1.0, batch * (k + 1) / knee) / max(1.0, batch / knee)


def gen_speedup(alpha: float, k: int, c: float, verify_ratio: float = 1.0) -> float:
    """S = E[N] / (k·c + verify_ratio) (Leviathan et al. 2023): the gen speedup, c (a drafter step)
    and verify_ratio (a verification) in units of one target decode step."""
    return expected_tokens(alpha, k) / (k * c + verify_ratio)


# ------------------------------------------------------------------ best k


def best_k(
    n: int,
    survival: Sequence[float],
    draft_share: float,
    target_s: Callable[[float], float],
    drafter_s: Callable[[int, int], float],
    k_max: int,
    scale: Callable[[int, int], float] | None = None,
    margin: float = 0.0,
) -> int:
    """The k_t in 0..k_max with the most expected tokens per second for a batch of n rows:
    n · E[N(k_t)] / step_s(n, k_t), k_t = 0 being a plain decode step; step_s is
    :func:`modeled_step_s` times ``scale(n, k_t)`` (measured / modeled, 1 without it). A k_t > 0
    must beat plain decoding by ``margin`` (a share: 0.1 = 10 %) to be chosen. Ties go to the
    smaller k_t."""

    def rate(k_t: int) -> float:
        secs = modeled_step_s(n, k_t, target_s, drafter_s) * (scale(n, k_t) if scale else 1.0)
        return n * expected_emitted(survival, k_t, draft_share) / max(secs, 1e-12) / (1.0 + margin if k_t else 1.0)

    return max(range(k_max + 1), key=lambda k_t: (rate(k_t), -k_t))


def best_of(speedup_by_k: Mapping[int, float]) -> int:
    """The k with the largest speedup in a table k -> speedup; ties go to the smaller k.

    Raises:
        ValueError: the table is empty."""
    if not speedup_by_k:
        raise ValueError("best_of: no k to choose from (empty speedup table)")
    return max(speedup_by_k, key=lambda k: (speedup_by_k[k], -k))
