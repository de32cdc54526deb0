"""``wb project --calibrate``: fit the unknown cost parameter to one measured point, predict the other k.

Model (Leviathan et al. 2023, arXiv 2211.17192; docs/design.md §4): with per-token acceptance α and k
drafts per verification step, tokens per step E[N] = (1 − α^(k+1)) / (1 − α) and the gen speedup

    S(k) = E[N](α, k) / (k·c + v(k)),

c = one drafter step / one target decode step, v(k) = one verification (B rows × (k+1) tokens in
flight) / one decode step (B rows × 1 token). The verification cost follows a roofline with a knee:
a forward over T tokens in flight costs max(1, T / T_knee) decode steps of ≤ T_knee tokens, so

    v(k) = max(1, B·(k+1) / T_knee) / max(1, B / T_knee)

(T_knee = ∞: memory-bound, v = 1; T_knee ≤ B: compute-bound, v = k+1). The roofline of
:func:`workbench.perf.analytic.roofline_time` has T_knee = FLOP/s × bytes per parameter / (2 × bandwidth):
~295 tokens for an H100 in bf16.

Given k, the measured acceptance (acceptance length, per-position rates or α) and the measured gen
speedup S at that k, one unknown is fitted in closed form, so the prediction at the measured k
reproduces S exactly:

- ``c``: c = (E[N] / S − v(k)) / k, with v(k) from a given T_knee (default memory-bound);
- ``knee``: v* = E[N] / S − k·c with c given; v* = 1 → memory-bound (T_knee ≥ B·(k+1), not
  identifiable), 1 < v* ≤ k+1 → T_knee = B·(k+1) / v*; outside [1, k+1] no knee fits.

Assumptions: per-position acceptance independent of position, r_i = α^(i+1) (α from the acceptance
length by inverting E[N], or fitted to the rates); c, α and the knee do not change with k; every
row of the batch stays in flight (B constant: the long tail of a batch is not modelled, see
``wb simulate --from-sweep`` for that); sampling, rejection and bookkeeping cost nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from workbench.rollout.cost import (
    alpha_from_acceptance_length,
    alpha_from_per_position,
    best_of,
    expected_tokens,
    gen_speedup,
    knee_verify_ratio,
)


def predict_speedup(alpha: float, k: int, c: float, batch: int = 256, knee: float | None = None) -> float:
    """S(k) = E[N](α, k) / (k·c + v(k)), v(k) the knee's verification ratio (:func:`knee_verify_ratio`)."""
    return gen_speedup(alpha, k, c, knee_verify_ratio(k, batch, knee))


def fit_c(speedup: float, k: int, tokens: float, verify: float = 1.0) -> float:
    """c with tokens / (k·c + verify) = speedup: c = (tokens / speedup − verify) / k.

    Raises:
        ValueError: the speedup is above tokens / verify (it would need c < 0).
    """
    c = (tokens / speedup - verify) / k
    if c < -1e-12:
        raise ValueError(
            f"gen speedup {speedup:.3f} at k={k} is above E[N] / verify = {tokens / verify:.3f}, the most the model "
            "allows with a free drafter (c = 0): check the acceptance length, or give a larger --knee"
        )
    return max(c, 0.0)


def fit_knee(speedup: float, k: int, tokens: float, c: float, batch: int) -> float:
    """T_knee (tokens in flight) with tokens / (k·c + v(k)) = speedup; ``math.inf`` when memory-bound.

    Raises:
        ValueError: no knee fits (the needed verification cost is below 1 or above k+1 decode steps).
    """
    need = tokens / speedup - k * c
    if need < 1.0 - 1e-9:
        raise ValueError(
            f"gen speedup {speedup:.3f} at k={k} needs a verification cheaper than one decode step ({need:.3f}) with "
            f"c={c:g}: lower --c, or fit c instead (--unknown c)"
        )
    if need > k + 1 + 1e-9:
        raise ValueError(
            f"gen speedup {speedup:.3f} at k={k} needs a verification of {need:.3f} decode steps, more than k+1 = "
            f"{k + 1} (fully compute-bound) with c={c:g}: the drafter costs more; raise --c, or fit c (--unknown c)"
        )
    return math.inf if need <= 1.0 + 1e-9 else batch * (k + 1) / min(need, k + 1.0)


@dataclass
class Calibration:
    k: int
    speedup: float  # measured
    alpha: float
    unknown: str  # "c" | "knee"
    c: float
    knee: float  # math.inf: memory-bound
    batch: int
    predictions: dict[int, float] = field(default_factory=dict)  # k -> predicted gen speedup

    @property
    def best_k(self) -> int:
        return best_of(self.predictions)


def calibrate(
    k: int,
    speedup: float,
    alpha: float,
    unknown: str = "c",
    c: float | None = None,
    knee: float | None = None,
    batch: int = 256,
    ks=range(1, 8),
) -> Calibration:
    """Fit ``unknown`` ("c": needs ``knee`` or none = memory-bound; "knee": needs ``c``) to the measured
    ``speedup`` at ``k`` with acceptance ``alpha``, and predict S for ``ks`` (the measured k included)."""
    if k < 1 or speedup <= 0:
        raise ValueError(f"need k >= 1 and a positive gen speedup (got k={k}, speedup={speedup})")
    tokens = expected_tokens(alpha, k)
    if unknown == "c":
        knee = math.inf if knee is None else knee
        c = fit_c(speedup, k, tokens, knee_verify_ratio(k, batch, knee))
    elif unknown == "knee":
        if c is None:
            raise ValueError("--unknown knee: give the drafter cost ratio --c (drafter step / target step)")
        knee = fit_knee(speedup, k, tokens, c, batch)
    else:
        raise ValueError(f"--unknown: {unknown!r} is not c or knee")
    preds = {j: predict_speedup(alpha, j, c, batch, knee) for j in sorted({*ks, k})}
    return Calibration(k, speedup, alpha, unknown, c, knee, batch, preds)


def alpha_from_inputs(
    k: int, acceptance_length: float | None, per_pos: list[float] | None, alpha: float | None
) -> tuple[float, str]:
    """(α, how) from exactly one of the acceptance length at k, per-position rates, or α itself."""
    given = [x is not None for x in (acceptance_length, per_pos, alpha)]
    if sum(given) != 1:
        raise ValueError(
            "give exactly one of --acceptance-length L, --per-pos 'r0,r1,..' or --alpha A (the measured acceptance)"
        )
    if acceptance_length is not None:
        if not 1.0 <= acceptance_length <= k + 1:
            raise ValueError(f"--acceptance-length {acceptance_length} is outside [1, k+1] = [1, {k + 1}]")
        return alpha_from_acceptance_length(
            acceptance_length, k
        ), f"from acceptance length {acceptance_length:g} at k={k}"
    if per_pos is not None:
        return alpha_from_per_position(
            per_pos
        ), f"fitted to per-position rates r_i ≈ α^(i+1) ({', '.join(f'{r:g}' for r in per_pos)})"
    return float(alpha), "given"
