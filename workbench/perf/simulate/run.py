"""``wb simulate`` end to end: calibrate one unknown on one measured point, run every variant, sweep a grid.

Calibration (as ``wb project --calibrate`` does for its model): the scenario's ``calibration``
section names one unknown (``hardware.bandwidth_efficiency``, ``hardware.flops_efficiency``,
``gen.step_overhead_s`` or ``gen.draft_overhead_s``), the variant and arm measured and its gen
seconds; the unknown is solved so the model reproduces that one number (Illinois regula falsi on
its range: gen seconds are monotone in each unknown), then fixed for every variant and sweep point:
everything else is a prediction. Sweep arguments use the sweep grammar of ``wb sweep``
(:func:`workbench.specs.grid.parse_axis`: ``k=1..7``, ``gpus=512,2048``, ``KEY=VALUE`` fixed), with
the aliases of :data:`ALIASES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from workbench.perf.simulate.rollout import gen_stage
from workbench.perf.simulate.scenario import Scenario, validate, variant_raw
from workbench.perf.simulate.step import StepResult, simulate
from workbench.specs.dotted import set_dotted
from workbench.specs.grid import SweepError, expand_grid, parse_axis
from workbench.specs.sections import SpecError

ALIASES = {
    "k": "speculation.k",
    "gpus": "cluster.gpus",
    "staleness": "async.staleness",
    "tp": "gen.tp",
    "drafter": "speculation.drafter",
    "alpha": "speculation.alpha",
    "hardware": "hardware.preset",
}
UNKNOWNS = {  # unknown -> (dotted key, low, high)
    "bandwidth_efficiency": ("hardware.bandwidth_efficiency", 0.02, 1.0),
    "flops_efficiency": ("hardware.flops_efficiency", 0.02, 1.0),
    "step_overhead_s": ("gen.step_overhead_s", 0.0, 0.5),
    "draft_overhead_s": ("gen.draft_overhead_s", 0.0, 0.5),
}
REFERENCE_KEYS = (
    "gen_ar",
    "gen_spec",
    "step_ar",
    "step_spec",
    "gen_speedup",
    "step_speedup",
    "e2e_speedup",
    "rollout_speedup",
)


def solve_monotone(
    f: Callable[[float], float], target: float, lo: float, hi: float, rtol: float = 1e-4, iters: int = 40
) -> float:
    """x in [lo, hi] with f(x) = target for a monotone f (Illinois regula falsi).

    Raises:
        ValueError: target outside [f(lo), f(hi)] (no x in the range reproduces it).
    """
    flo, fhi = f(lo) - target, f(hi) - target
    if flo == 0:
        return lo
    if fhi == 0:
        return hi
    if flo * fhi > 0:
        raise ValueError(
            f"no value in [{lo:g}, {hi:g}] reproduces {target:g}: the model gives {flo + target:.4g} .. "
            f"{fhi + target:.4g} over that range"
        )
    side = 0
    x = lo
    for _ in range(iters):
        x = (lo * fhi - hi * flo) / (fhi - flo)
        fx = f(x) - target
        if abs(fx) <= rtol * abs(target):
            return x
        if fx * fhi > 0:
            hi, fhi = x, fx
            if side == -1:
                flo /= 2
            side = -1
        else:
            lo, flo = x, fx
            if side == 1:
                fhi /= 2
            side = 1
    return x


@dataclass
class Fit:
    """The calibrated unknown: its dotted key and value, and the point it was fitted to."""

    unknown: str
    key: str
    value: float
    variant: str | None
    arm: str
    measured_gen_s: float


def calibrate(raw: dict[str, Any], base: Scenario) -> Fit | None:
    """Solve the scenario's calibration unknown (module doc); None when ``calibration.unknown`` is none.

    Raises:
        SpecError: the variant is unknown, or no value of the unknown in its range fits (named).
    """
    cal = base.calibration
    if cal.unknown == "none":
        return None
    key, lo, hi = UNKNOWNS[cal.unknown]
    point_raw = variant_raw(raw, cal.variant) if cal.variant else raw
    k = base.speculation.k if cal.arm == "speculative" else 0

    def gen_s(x: float) -> float:
        sc = validate(set_dotted(point_raw, key, x), "calibration point")
        return gen_stage(sc, k if sc.speculation.drafter != "none" else 0).seconds

    try:
        value = solve_monotone(gen_s, cal.gen_s, lo, hi)
    except ValueError as e:
        raise SpecError(
            f"calibration of {key} on {cal.variant or 'the base'} ({cal.arm}, {cal.gen_s:g} s): {e}"
        ) from None
    return Fit(cal.unknown, key, value, cal.variant, cal.arm, cal.gen_s)


def compare(
    res: StepResult,
    reference: dict[str, float],
    by_k: dict[int, dict[str, float]] | None = None,
    at_gpus: dict[str, float] | None = None,
) -> dict[str, tuple[float, float, float]]:
    """{name: (predicted, reference, relative error)} for each reference value the result has:
    ``reference`` (every point), ``at_gpus`` (the values published for this row's GPU count: they win over
    ``reference``) and ``by_k[res.k]`` (this row's k; it wins on a clash); and, for every other k of the row's
    k scan with a ``gen_speedup`` in ``by_k``, ``gen_speedup_k<j>`` (the k curve)."""
    by_k = by_k or {}
    pred = {
        "gen_ar": res.gen_ar,
        "gen_spec": res.gen_spec,
        "step_ar": res.step_ar,
        "step_spec": res.step_spec,
        "gen_speedup": res.gen_speedup,
        "rollout_speedup": res.gen_speedup,
        "step_speedup": res.step_speedup,
        "e2e_speedup": res.e2e_speedup,
    }
    ref = {**reference, **(at_gpus or {}), **by_k.get(res.k, {})}
    out = {n: (pred[n], v, pred[n] / v - 1.0) for n, v in ref.items() if n in pred}
    for j, vals in sorted(by_k.items()):
        if j != res.k and "gen_speedup" in vals and j in res.gen_speedup_by_k:
            p, v = res.gen_speedup_by_k[j], vals["gen_speedup"]
            out[f"gen_speedup_k{j}"] = (p, v, p / v - 1.0)
    return out


@dataclass
class Row:
    """One simulated point: its variant, the sweep values that made it, the result and the comparison."""

    variant: str
    point: dict[str, str]
    result: StepResult
    errors: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    def record(self) -> dict:
        return {
            "variant": self.variant,
            "point": self.point,
            **self.result.record(),
            "reference": {n: {"predicted": p, "reference": r, "error": e} for n, (p, r, e) in self.errors.items()},
        }


def parse_grid(items: list[str]) -> tuple[list[dict[str, str]], list[tuple[str, str]]]:
    """(grid points as {dotted key: raw value}, fixed (key, value) overrides) from sweep arguments."""
    axes, fixed, seen = [], [], set()
    for item in items:
        a = parse_axis(item)
        key = ALIASES.get(a.name, a.name)
        if key in seen:
            raise SweepError(f"{key!r} is given twice; give it once")
        seen.add(key)
        (fixed if a.fixed else axes).append(a.__class__(a.name, key, a.values, a.fixed))
    return expand_grid(axes), [(a.key, a.values[0]) for a in fixed]


def run(
    raw: dict[str, Any],
    base: Scenario,
    grid_items: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[Fit | None, list[Row]]:
    """Calibrate, then simulate every variant (or the base) at every grid point (module doc).

    Raises:
        SpecError: a bad sweep argument, a point whose scenario is invalid, or a failed calibration.
    """
    from workbench.specs.load import parse_override

    grid, fixed = parse_grid(grid_items or [])
    for key, value in fixed:
        raw = set_dotted(raw, key, parse_override(f"{key}={value}")[1])
    base = validate(raw, "scenario with sweep overrides") if fixed else base
    fit = calibrate(raw, base)
    if fit:
        raw = set_dotted(raw, fit.key, fit.value)
    scan = not any("speculation.k" in p for p in grid)
    rows: list[Row] = []
    for point in grid:
        point_raw = raw
        for key, value in point.items():
            point_raw = set_dotted(point_raw, key, parse_override(f"{key}={value}")[1])
        for variant in base.variants or [None]:
            label = variant or base.name
            if progress:
                progress(f"{label} {' '.join(f'{k}={v}' for k, v in point.items())}".strip())
            vr = variant_raw(point_raw, variant) if variant else point_raw
            sc = validate(vr, f"scenario {label}" + (f" at {point}" if point else ""))
            try:
                res = simulate(sc, scan=scan)
            except ValueError as e:
                raise SpecError(f"{label} {point or ''}: {e}") from None
            res.name = label
            at_gpus = sc.reference_by_gpus.get(sc.cluster.gpus)
            rows.append(Row(label, dict(point), res, compare(res, sc.reference, sc.reference_by_k, at_gpus)))
    return fit, rows
