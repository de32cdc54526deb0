"""Out-of-sample validation of a scenario (#33): calibrate the one unknown on one published point, predict the rest.

:func:`holdout` sets the scenario's ``calibration`` to one variant's speculative gen seconds at one k
(its ``reference_by_k[k]["gen_spec"]``), solves the unknown there (:func:`workbench.perf.simulate.run.calibrate`)
and simulates every variant: each other reference value is a prediction. Run it twice with different
calibration points (RL-Zero k = 3, then RL-Think k = 3) to see how much of the fit is the point it saw.

Each comparison also carries the *per-step cost* the speedup implies, AL / speedup (acceptance length
over gen speedup: the average cost of one speculative step in autoregressive steps, the tail included),
for the model and for the published speedup; their gap, divided by k, is what the model is missing per
draft position (:func:`implied_step_cost`).

:func:`fit_second_unknown` is a diagnostic, never the scenario: it fits a second unknown (for example
``gen.draft_overhead_s``) to one more published point, re-solving the calibration at each trial value,
so the two fitted numbers are named and the other points stay predictions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.perf.simulate.rollout import acceptance_length
from workbench.perf.simulate.run import Fit, Row, run, solve_monotone
from workbench.perf.simulate.scenario import Scenario, Speculation, validate, variant_raw
from workbench.specs.dotted import set_dotted
from workbench.specs.sections import SpecError


def implied_step_cost(acceptance_length: float, speedup: float) -> float:
    """AL / speedup: the mean cost of one speculative step in autoregressive steps (dimensionless) that a
    gen speedup implies at that acceptance length (a stage of L tokens: L/AL steps of c each vs L steps of 1).

    Raises:
        ValueError: a non-positive speedup.
    """
    if speedup <= 0:
        raise ValueError(f"speedup must be > 0 (got {speedup})")
    return acceptance_length / speedup


def calibration_point(raw: dict[str, Any], variant: str, k: int) -> float:
    """The published speculative gen seconds of ``variant`` at ``k`` (its ``reference_by_k[k]["gen_spec"]``).

    Raises:
        SpecError: the variant has no such reference (named).
    """
    sc = validate(variant_raw(raw, variant), f"variant {variant}")
    try:
        return float(sc.reference_by_k[k]["gen_spec"])
    except KeyError:
        raise SpecError(f"variant {variant!r} has no reference_by_k[{k}].gen_spec to calibrate on") from None


@dataclass
class Holdout:
    """One calibration point and every comparison it predicts."""

    variant: str
    k: int
    fit: Fit
    rows: list[Row]
    speculation: dict[str, Speculation] = field(default_factory=dict)  # each variant's drafter and acceptance
    fixed: dict[str, float] = field(default_factory=dict)  # second unknowns held fixed (diagnostics only)

    def table(self) -> list[dict[str, Any]]:
        """One dict per compared value: variant, quantity, k, predicted, published, error, role
        (``calibrated`` for the point the unknown was solved on, else ``predicted``), and for speedups the
        implied per-step cost of both (:func:`implied_step_cost`)."""
        out = []
        for r in self.rows:
            res = r.result
            for name, (p, v, e) in r.errors.items():
                k = (
                    int(name.rsplit("_k", 1)[1])
                    if name.startswith("gen_speedup_k")
                    else (0 if name.endswith("_ar") else res.k)
                )
                role = (
                    "calibrated" if (r.variant == self.variant and k == self.k and name == "gen_spec") else "predicted"
                )
                row = {
                    "variant": r.variant,
                    "quantity": name.split("_k")[0] if name.startswith("gen_speedup_k") else name,
                    "k": k,
                    "predicted": p,
                    "published": v,
                    "error": e,
                    "role": role,
                }
                if row["quantity"] == "gen_speedup":
                    al = acceptance_length(self.speculation[r.variant], k)
                    row.update(
                        acceptance_length=al,
                        cost_predicted=implied_step_cost(al, p),
                        cost_published=implied_step_cost(al, v),
                    )
                out.append(row)
        return out

    def record(self) -> dict[str, Any]:
        return {
            "calibrated_on": {"variant": self.variant, "k": self.k, "gen_s": self.fit.measured_gen_s},
            "fit": {"key": self.fit.key, "value": self.fit.value},
            "fixed": self.fixed,
            "table": self.table(),
            "rows": [r.record() for r in self.rows],
        }


def holdout(
    raw: dict[str, Any], base: Scenario, variant: str, k: int, fixed: dict[str, float] | None = None
) -> Holdout:
    """Calibrate ``base.calibration.unknown`` on ``variant``'s published speculative gen at ``k`` and
    simulate every variant (module doc); ``fixed``: dotted keys set first (a diagnostic's second unknown).

    Raises:
        SpecError: no unknown named in the scenario, no such reference, or a failed calibration.
    """
    if base.calibration.unknown == "none":
        raise SpecError("holdout needs calibration.unknown (the one fitted quantity), e.g. flops_efficiency")
    for key, value in (fixed or {}).items():
        raw = set_dotted(raw, key, value)
    gen_s = calibration_point(raw, variant, k)
    for key, value in (
        ("calibration.variant", variant),
        ("calibration.arm", "speculative"),
        ("calibration.gen_s", gen_s),
        ("speculation.k", k),
    ):
        raw = set_dotted(raw, key, value)
    sc = validate(raw, "holdout scenario")
    fit, rows = run(raw, sc)
    assert fit is not None
    spec = {v: validate(variant_raw(raw, v), f"variant {v}").speculation for v in sc.variants}
    return Holdout(variant, k, fit, rows, spec, dict(fixed or {}))


def fit_second_unknown(
    raw: dict[str, Any],
    base: Scenario,
    key: str,
    lo: float,
    hi: float,
    target_variant: str,
    target_k: int,
    calibrate_variant: str,
    calibrate_k: int,
) -> tuple[float, Holdout]:
    """(value, holdout): the ``key`` at which ``target_variant``'s gen speedup at ``target_k`` is its published
    one, the scenario's unknown re-calibrated on ``calibrate_variant`` at ``calibrate_k`` for every trial
    value (two fitted quantities; module doc). Speedups fall as a per-draft cost grows, so the search is
    monotone in ``key`` on [lo, hi].

    Raises:
        SpecError: no value in [lo, hi] reproduces the target (the message gives the model's range).
    """
    target = validate(variant_raw(raw, target_variant), target_variant).reference_by_k[target_k]["gen_speedup"]
    only = {**raw, "variants": {v: raw["variants"][v] for v in {target_variant, calibrate_variant}}}
    cache: dict[float, Holdout] = {}

    def speedup(x: float) -> float:
        h = cache[x] = holdout(
            set_dotted(only, "speculation.k_scan", sorted({calibrate_k, target_k})),
            base,
            calibrate_variant,
            calibrate_k,
            {key: x},
        )
        row = next(r for r in h.rows if r.variant == target_variant)
        return row.result.gen_speedup_by_k[target_k]

    try:
        x = solve_monotone(lambda v: -speedup(v), -target, lo, hi, rtol=1e-3)
    except ValueError as e:
        raise SpecError(f"{key} for {target_variant} k={target_k} speedup {target:g}: {e}") from None
    return x, holdout(raw, base, calibrate_variant, calibrate_k, {key: x})
