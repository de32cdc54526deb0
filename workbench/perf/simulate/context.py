"""Acceptance that falls with context length: a drafter trained on short sequences, on long rollouts.

EAGLE-3 heads are trained on sequences of a few thousand tokens, and their acceptance falls as the
context grows past that: vllm-project/speculators#684 measured a Qwen3-8B EAGLE-3 head in vLLM at an
acceptance length of 2.295 at 2k tokens of context, 1.687 at 8k and 1.090 at 16k (LongBench-v2
prompts truncated to each length, temperature 0); sglang#6783 and SpecForge#271 report the same for
heads whose ``max_position_embeddings`` is below the context, vllm-ascend#10023 for Qwen3-30B-A3B
(2.43 on GSM8K, 1.34 on LongBench). A reasoning rollout's later tokens sit at such contexts, so the
long tail the gen stage waits for is drafted worst.

``speculation.acceptance_vs_context`` gives such a table (acceptance length at each context, at
``acceptance_vs_context_k`` draft tokens); only its shape is used. At context c the accepted draft
tokens per step are r(c) = (AL(c) − 1)/(AL(c₀) − 1) times those at the table's first context c₀
(linear between entries, flat before the first and after the last), and the per-position α(c) is the
one whose E[N] − 1 at the table's k is r(c) times that of α_ref (:func:`alpha_profile`); any other k
follows from α(c) (docs/design.md §4). A row then needs ∫ dc / E[N](c) verification steps over its
tokens' contexts, with variance ∫ Var(N)(c) / E[N](c)³ dc (the renewal CLT of
:func:`workbench.perf.simulate.rollout.row_steps`, integrated over a varying step law):
:func:`row_steps_ctx`. α_ref is the scenario's ``alpha``, or fitted so the stage's tokens per
verification step (Σ (L − 1) / Σ steps, what vLLM reports as the mean acceptance length) equal the
given ``acceptance_length`` (:func:`fit_alpha_ref`).
"""

from __future__ import annotations

import numpy as np

GRID = 64  # tokens between the points the step integrals are tabulated at
_A = np.linspace(0.0, 0.999, 2000)  # α grid for inverting E[N](α) − 1


def _accepted(alpha: np.ndarray, k: int) -> np.ndarray:
    """E[N] − 1 = α + … + α^k (draft tokens accepted per step), elementwise."""
    a = np.asarray(alpha, dtype=float)
    return sum(a**j for j in range(1, k + 1))


def relative(table: dict[int, float], ctx: np.ndarray) -> np.ndarray:
    """r(c): accepted draft tokens per step at context ``ctx`` relative to the table's first context."""
    cs = np.array(sorted(table), dtype=float)
    acc = np.array([table[int(c)] - 1.0 for c in cs])
    if acc[0] <= 0:
        raise ValueError("speculation.acceptance_vs_context: the first entry must exceed 1 (some drafts accepted)")
    return np.interp(ctx, cs, acc / acc[0])


def alpha_profile(alpha_ref: float, table: dict[int, float], k_table: int, ctx: np.ndarray) -> np.ndarray:
    """α(c) at each context of ``ctx``: E[N](α(c), k_table) − 1 = r(c) · (E[N](α_ref, k_table) − 1)."""
    target = relative(table, ctx) * float(_accepted(np.array(alpha_ref), k_table))
    if (target > _accepted(_A[-1], k_table)).any():
        raise ValueError(
            f"speculation.acceptance_vs_context rises above its first entry by more than α_ref = {alpha_ref:.3f} "
            "allows (every draft would be accepted): give a table whose first entry is at its shortest, best-accepted "
            "context"
        )
    a = np.interp(target, _accepted(_A, k_table), _A)  # then Newton steps on α + … + α^k = target
    for _ in range(3):
        slope = sum(j * a ** (j - 1) for j in range(1, k_table + 1))
        a = np.clip(a - (_accepted(a, k_table) - target) / slope, 0.0, _A[-1])
    return a


def step_integrals(
    alpha_ref: float, table: dict[int, float], k_table: int, k: int, max_ctx: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(contexts, F, V) on a grid up to ``max_ctx``: F(c) = ∫₀^c dc'/E[N](c'), V(c) = ∫₀^c Var(N)(c')/E[N](c')³ dc'
    at ``k`` draft tokens (trapezoid rule), so a row's steps between two contexts are F differences."""
    c = np.arange(0, max_ctx + 2 * GRID, GRID, dtype=float)
    a = alpha_profile(alpha_ref, table, k_table, c)
    s = np.stack([a**j for j in range(k + 1)])  # (k+1, C) survival P(N ≥ j+1)
    e = s.sum(axis=0)
    var = np.maximum(((2 * np.arange(k + 1) + 1)[:, None] * s).sum(axis=0) - e**2, 0.0)

    def cum(y: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum((y[1:] + y[:-1]) / 2 * GRID)])

    return c, cum(1.0 / e), cum(var / e**3)


def mean_steps(
    lengths: np.ndarray, prompt: int, grid: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(expected steps, their variance) per row: its L − 1 verified tokens at contexts prompt + 1 .. prompt + L."""
    c, f, v = grid
    lo = prompt + 1.0
    hi = prompt + np.asarray(lengths, dtype=float)
    return np.interp(hi, c, f) - np.interp(lo, c, f), np.interp(hi, c, v) - np.interp(lo, c, v)


def row_steps_ctx(
    lengths: np.ndarray,
    prompt: int,
    grid: tuple[np.ndarray, np.ndarray, np.ndarray],
    k: int,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Verification steps per row with context-dependent acceptance (module doc): mean + z · sd, z ~ N(0, 1)
    per row, rounded up, bounded by (L − 1)/(k + 1) and L − 1 (as :func:`workbench.perf.simulate.rollout.row_steps`)."""
    n = np.asarray(lengths, dtype=float) - 1.0
    m, var = mean_steps(lengths, prompt, grid)
    x = m + (rng.standard_normal(n.size) * np.sqrt(var) if rng is not None else 0.0)
    return np.clip(np.ceil(x - 1e-9), np.ceil(n / (k + 1) - 1e-9), n)


def stage_acceptance(
    lengths: np.ndarray, prompt: int, alpha_ref: float, table: dict[int, float], k_table: int, k: int
) -> float:
    """Tokens per verification step over the stage, Σ (L − 1) / Σ expected steps (vLLM's mean acceptance length)."""
    grid = step_integrals(alpha_ref, table, k_table, k, prompt + int(np.max(lengths)))
    m, _ = mean_steps(lengths, prompt, grid)
    return float((np.asarray(lengths, dtype=float) - 1).sum() / max(m.sum(), 1e-12))


def fit_alpha_ref(
    lengths: np.ndarray, prompt: int, table: dict[int, float], k_table: int, k: int, measured: float
) -> float:
    """α_ref whose stage acceptance at ``k`` (:func:`stage_acceptance`) is ``measured`` (bisection).

    Raises:
        ValueError: ``measured`` is out of reach even at α_ref → 1 (the decay caps it), or below 1.
    """
    if measured < 1.0:
        raise ValueError(f"acceptance length {measured} < 1")
    top = stage_acceptance(lengths, prompt, _A[-1], table, k_table, k)
    if measured > top:
        raise ValueError(
            f"acceptance length {measured:.3f} at k={k} cannot be reached with speculation.acceptance_vs_context's "
            f"decay over these lengths (at most {top:.3f}); shorter responses or a flatter table"
        )
    lo, hi = 0.0, float(_A[-1])
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if stage_acceptance(lengths, prompt, mid, table, k_table, k) < measured else (lo, mid)
    return (lo + hi) / 2
