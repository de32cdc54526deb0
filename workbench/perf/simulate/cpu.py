"""``wb simulate --from-sweep``: the machine a sweep ran on as the hardware, one unknown fitted at one k.

The gen stage of one GRPO step, each arm as the workbench engine runs it (docs/design.md §13, the CPU
leg of the simulator's validation):

- rows: the step's completions (:meth:`~workbench.perf.simulate.from_sweep.SweepWorkload.lengths`) in
  batches of ``chunk`` rows decoded together; a batch runs until its longest row is done and rows
  leave as they finish (:func:`workbench.perf.simulate.rollout.replica_time`, all the batch's rows
  admitted at once, as the engine does with ``rollout.continuous_batching`` false or not logged);
  continuous (``SweepWorkload.continuous``: the param true and more rows than ``chunk``), all the
  step's rows in ``chunk`` slots, waiting rows joining in order as rows finish (the engine's slot
  schedule, :func:`workbench.perf.steps.slot_schedule`), each admission one prefill forward of
  the rows it admits (:func:`batches`);
- speculative arm: row i needs L_i − 1 tokens after the prefill; each verification step emits j + 1
  tokens with the point's measured probability (per-position acceptance, accepts form a prefix;
  undrafted row-steps emit 1: :func:`workbench.perf.steps.emit_pmf`), so a row's step count is
  random and the batch runs for the largest (:func:`row_steps`, fixed seeds: the same draws at every
  value of the unknown); the autoregressive arm takes L_i − 1 decode steps;
- a step at n live rows costs target(n · (k + 1)) + drafter(n) from the measured curves
  (:class:`~workbench.perf.simulate.measured.MeasuredHardware`; k = 0 and no drafter for the
  autoregressive arm), a batch's prefill target(n · prompt) (+ the draft model's over the prompt;
  eagle3's and ngram's prefill are not measured and left out), linear extrapolation past a curve's
  last point;
- the unknown (:data:`UNKNOWNS`), seconds the curves leave out (sampling, rejection sampling,
  bookkeeping): each arm's seconds are base + x · weight, so the predicted paired speedup is
  (A + x·a) / (B + x·b) and x is solved in closed form at the calibration k (as
  :func:`workbench.perf.calibrate.fit_c` does), then held for every other k of that drafter.
  x may be negative (the curves overstate a verification step relative to a decode step) as long
  as every step keeps a positive cost.

The predicted speedup is mean autoregressive seconds / mean speculative seconds over the draws; the
measured one is the geometric mean of per-step paired ratios [95 % CI], over ≥ 2 runs (seeds) of a
point the random-effects estimate over them (:func:`workbench.stats.runs_ci`: the calibration fits
it and the CI a prediction is checked against holds the between-run scatter); the error is predicted /
measured − 1 and a miss is how far the prediction lies outside the CI (relative to the nearer end).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from drafters import draft_cost_of
from workbench.perf.simulate.from_sweep import SweepPoint, SweepWorkload
from workbench.perf.simulate.measured import MeasuredHardware
from workbench.perf.simulate.rollout import replica_time
from workbench.rollout.cost import modeled_step_s

UNKNOWNS = {
    "verify_overhead_s": "seconds per verification step of the speculative arm beyond its forwards (rejection "
    "sampling, drafts' sampling, bookkeeping)",
    "step_overhead_s": "seconds per target forward of either arm, decode or verification (sampling, bookkeeping)",
    "draft_overhead_s": "seconds per draft position per verification step (k per step)",
}


def row_steps(lengths: np.ndarray, pmf: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Verification steps each row takes to generate its L − 1 tokens after the prefill, each step
    emitting j + 1 tokens with probability pmf[j] (pmf = [1]: L − 1 steps, the autoregressive count)."""
    rem = np.maximum(np.asarray(lengths, dtype=np.int64) - 1, 0)
    if rem.size == 0 or rem.max() == 0:
        return np.zeros(rem.size, dtype=np.int64)
    p = np.asarray(pmf, dtype=float)
    emits = rng.choice(p.size, size=(rem.size, int(rem.max())), p=p / p.sum()) + 1
    steps = (emits.cumsum(1) < rem[:, None]).sum(1) + 1
    return np.where(rem > 0, steps, 0)


def batches(lengths: np.ndarray, chunk: int, continuous: bool) -> list[np.ndarray]:
    """The row groups the engine admits from a full queue: consecutive chunks of ``chunk`` rows, or
    (``continuous``) one queue that :func:`~workbench.perf.simulate.rollout.replica_time` feeds into ``chunk`` slots."""
    return [lengths] if continuous else [lengths[i : i + chunk] for i in range(0, len(lengths), chunk)]


@dataclass
class ArmTime:
    """One arm's mean seconds per GRPO step from the curves (``base``) and what the unknown multiplies."""

    k: int  # 0: autoregressive
    base: float  # seconds: forwards, drafter, prefill
    forwards: float  # target forwards (decode or verification) per GRPO step

    def weight(self, unknown: str) -> float:
        """How many times ``unknown`` is paid per GRPO step in this arm."""
        if unknown == "step_overhead_s":
            return self.forwards
        if unknown == "verify_overhead_s":
            return self.forwards if self.k else 0.0
        if unknown == "draft_overhead_s":
            return self.k * self.forwards
        raise ValueError(f"unknown {unknown!r}: one of {', '.join(UNKNOWNS)}")

    def seconds(self, unknown: str, x: float) -> float:
        return self.base + x * self.weight(unknown)


def arm_time(
    wl: SweepWorkload, hw: MeasuredHardware, lengths: list[np.ndarray], point: SweepPoint | None, seed: int = 0
) -> ArmTime:
    """Mean seconds per GRPO step (module doc) over the ``lengths`` draws: autoregressive with
    ``point`` None, else the point's speculative arm."""
    k = point.k if point else 0
    d = hw.drafter(point.kind, k) if point else None
    draft_curve = d.curve if d is not None and draft_cost_of(point.kind) == "model" else None
    rng = np.random.default_rng([seed, k])
    P = wl.prompt_len

    def step_s(rows: float, _context: float) -> float:
        return modeled_step_s(rows, k, hw.target.time, lambda n, _k: d.step(n) if d is not None else 0.0)

    def prefill_s(n: int) -> float:
        return (hw.target.time(n * P) + (draft_curve.time(n * P) if draft_curve is not None else 0.0)) if P else 0.0

    base = forwards = 0.0
    for L in lengths:
        for part in batches(L, wl.chunk, wl.continuous):
            todo = part if point is None else 1 + row_steps(part, point.pmf, rng)  # in steps of one "token"
            s, _, n = replica_time(todo, P, wl.chunk, math.inf, 1.0, step_s, prefill_s)
            base, forwards = base + s, forwards + n
    return ArmTime(k, base / len(lengths), forwards / len(lengths))


def fit_unknown(measured: float, ar: ArmTime, spec: ArmTime, unknown: str) -> float:
    """x with (A + x·a) / (B + x·b) = ``measured`` (A, a: autoregressive base and weight; B, b: speculative).

    Raises:
        ValueError: no x reproduces it (the unknown does not act on that ratio).
    """
    a, b = ar.weight(unknown), spec.weight(unknown)
    den = measured * b - a
    if abs(den) < 1e-12:
        raise ValueError(
            f"{unknown} cannot move the predicted speedup at k={spec.k} (it weighs both arms alike); fit another "
            "unknown"
        )
    return (ar.base - measured * spec.base) / den


def min_step_cost(hw: MeasuredHardware, point: SweepPoint | None, unknown: str, x: float) -> float:
    """The cheapest step of an arm (one live row) with the unknown added: must stay > 0."""
    k = point.k if point else 0
    one = ArmTime(k, 0.0, 1.0)
    return modeled_step_s(1, k, hw.target.time, lambda n, _k: hw.drafter(point.kind, k).step(n)) + x * one.weight(
        unknown
    )


@dataclass
class CpuRow:
    """One point: measured paired gen speedup [95 % CI], the prediction, and where it landed."""

    kind: str
    k: int
    acceptance_length: float
    measured: float
    low: float
    high: float
    predicted: float
    modeled: float | None  # the run's own speedup/gen_modeled (counted forwards, no unknown)
    calibration: bool  # the point the unknown was fitted to
    gen_ar_s: float  # predicted seconds per GRPO step (curve speed), autoregressive arm
    gen_spec_s: float
    runs: int = 1  # runs (seeds) behind ``measured``
    tau: float | None = None  # their between-run spread (sd of the log speedup) when random effects, else None

    @property
    def inside(self) -> bool:
        return self.low <= self.predicted <= self.high

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0

    @property
    def miss(self) -> float:
        """0 inside the CI, else predicted / nearer CI end − 1."""
        return 0.0 if self.inside else self.predicted / (self.high if self.predicted > self.high else self.low) - 1.0

    def record(self) -> dict:
        return {**asdict(self), "inside": self.inside, "error": self.error, "miss": self.miss}


@dataclass
class CpuCheck:
    """Every point of a sweep predicted from one calibration per drafter (``fits``: kind -> x)."""

    sweep: str
    unknown: str
    calibrate_k: int
    fits: dict[str, float]
    rows: list[CpuRow]
    workload: dict
    hardware: dict
    notes: list[str] = field(default_factory=list)

    @property
    def predicted_rows(self) -> list[CpuRow]:
        return [r for r in self.rows if not r.calibration]

    def record(self) -> dict:
        return {
            "sweep": self.sweep,
            "unknown": self.unknown,
            "unknown_means": UNKNOWNS[self.unknown],
            "calibrate_k": self.calibrate_k,
            "fits": self.fits,
            "workload": self.workload,
            "hardware": self.hardware,
            "notes": self.notes,
            "inside": sum(r.inside for r in self.predicted_rows),
            "predicted": len(self.predicted_rows),
            "rows": [r.record() for r in self.rows],
        }


def check(
    wl: SweepWorkload,
    hw: MeasuredHardware,
    calibrate_k: int,
    unknown: str = "verify_overhead_s",
    draws: int = 32,
    seed: int = 0,
) -> CpuCheck:
    """Fit ``unknown`` per drafter kind at its point k = ``calibrate_k``, predict its other points.

    Raises:
        ValueError: a bad unknown, no point at ``calibrate_k``, a drafter cost missing from ``hw``, or a
            fit that makes a step cost ≤ 0 (the curves do not describe the run: other machine or threads).
    """
    if unknown not in UNKNOWNS:
        raise ValueError(f"--unknown {unknown!r}: one of {', '.join(UNKNOWNS)}")
    lengths = wl.lengths(draws, seed)
    ar = arm_time(wl, hw, lengths, None, seed)
    kinds = list(dict.fromkeys(p.kind for p in wl.points))
    fits, rows, notes = {}, [], list(wl.skipped)
    for kind in kinds:
        pts = [p for p in wl.points if p.kind == kind]
        cal = next((p for p in pts if p.k == calibrate_k), None)
        if cal is None:
            notes.append(
                f"{kind}: no point at k={calibrate_k} to calibrate on (has k={', '.join(str(p.k) for p in pts)}); "
                "not predicted"
            )
            continue
        arms = {p.k: arm_time(wl, hw, lengths, p, seed) for p in pts}
        x = fit_unknown(cal.measured.mean, ar, arms[calibrate_k], unknown)
        for p in [None, *pts]:
            if min_step_cost(hw, p, unknown, x) <= 0:
                raise ValueError(
                    f"{kind}: the measured {cal.measured.mean:.3f}× at k={calibrate_k} needs {unknown} = "
                    f"{x * 1e3:.3g} ms, which makes a {'decode' if p is None else f'k={p.k} verification'} step cost ≤ "
                    "0: the cost curves do not describe that run (another machine, thread count or load); measure "
                    "them where the sweep ran"
                )
        fits[kind] = x
        for p in pts:
            a_s, s_s = ar.seconds(unknown, x), arms[p.k].seconds(unknown, x)
            m = p.measured
            rows.append(
                CpuRow(
                    kind,
                    p.k,
                    p.acceptance_length,
                    m.mean,
                    m.low,
                    m.high,
                    a_s / s_s,
                    p.modeled,
                    p.k == calibrate_k,
                    a_s,
                    s_s,
                    len(p.run_ids),
                    p.runs.tau if p.runs is not None else None,
                )
            )
    if not rows:
        raise ValueError(f"no drafter of sweep {wl.name!r} has a point at k={calibrate_k} (--calibrate-k)")
    workload = {
        "rows": wl.rows,
        "chunk": wl.chunk,
        "max_new_tokens": wl.max_new_tokens,
        "mean_len": wl.mean_len,
        "cv": wl.cv,
        "ar_forwards": wl.ar_forwards,
        "prompt_len": wl.prompt_len,
        "continuous": wl.continuous,
        "draws": draws,
        "seed": seed,
        "lengths": f"measured: {wl.measured.describe()}" if wl.measured is not None else wl.lengths_note,
    }
    return CpuCheck(wl.name, unknown, calibrate_k, fits, rows, workload, dict(hw.meta), notes)
