"""A sweep's results: per-point summaries, paired speedups with CIs, repeats pooled, best or tie.

Pure functions over what `wb sweep` ran (or read back on resume); the Rich table and the
``results.json`` the parent run keeps. Rules (docs/design.md §8):

- A point's speedup is its *paired* measurement: per step, autoregressive gen s / speculative gen
  s of the same prompts in the same process (``speedup/gen_per_step``, ``speedup/step_per_step``;
  older runs: per-step ``speedup/gen``, ``speedup/step``), summarised by the geometric mean and a
  95 % interval on the log-ratios (workbench.stats). A point run with
  ``measure.paired=false`` falls back to its baseline's mean seconds / its own (marked ``~``, no
  interval: a ratio of timings taken minutes apart).
- Repeats: points that differ only in ``seed`` (``seed=0..4`` or ``--repeats N``) are one row, the
  other columns means over the repeats. With >= 2 runs the row's speedup is the random-effects
  estimate over its runs (workbench.stats.runs_ci: a run's per-step interval covers the noise of its
  steps, not a repeat's) and ``τ`` their between-run spread; a row with one run, or
  a run too short for a within-run variance (< 2 steps after warm-up), keeps the per-step interval
  of its (pooled) ratios.
- Best: the row with the highest speedup is marked best only when its interval's lower end is above
  every other row's upper end; otherwise the rows whose intervals reach it are named as a tie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rich import box
from rich.table import Table

from workbench import metrics as M
from workbench.stats import Decision, RatioCI, RunsCI, after_warmup, decide, per_step_ratios, ratio_ci, runs_ci
from workbench.sweep.grid import ALIAS_OF, REPEAT_KEY, SweepPlan

SUMMARY_KEYS = (M.GEN_S, M.STEP_S, M.GEN_AR_S, M.ACCEPTANCE_LENGTH, M.ACCEPTANCE_RATE)


def summarize(history: list[dict[str, float]], warmup: int = 1) -> dict[str, float | None]:
    """Means over steps after ``warmup`` (workbench.stats.after_warmup) and the final reward.

    Keys: SUMMARY_KEYS (seconds; tokens per verification step; fraction), ``reward/final`` (last
    step's reward/mean), ``spec/acceptance_length_first`` / ``_last`` (step 1 and the last step).
    """
    out: dict[str, float | None] = {}
    for k in SUMMARY_KEYS:
        vals = after_warmup([h[k] for h in history if k in h], warmup)
        out[k] = sum(vals) / len(vals) if vals else None
    rewards = [h[M.REWARD_MEAN] for h in history if M.REWARD_MEAN in h]
    out[M.REWARD_FINAL] = rewards[-1] if rewards else None
    acc = [h[M.ACCEPTANCE_LENGTH] for h in history if M.ACCEPTANCE_LENGTH in h]
    out[M.ACCEPTANCE_LENGTH_FIRST] = acc[0] if acc else None  # step 1 vs the last step: does the drafter
    out[M.ACCEPTANCE_LENGTH_LAST] = acc[-1] if acc else None  # keep up with the moving policy?
    return out


def speedup(baseline_s: float | None, point_s: float | None) -> float | None:
    """baseline seconds / point seconds (> 1: the point is faster); None if either is missing or 0."""
    if not baseline_s or not point_s:
        return None
    return baseline_s / point_s


@dataclass
class Outcome:
    """What happened to one point: status ``ok`` | ``skipped`` (finished earlier) | ``other`` (run by
    another worker of the sweep meanwhile) | ``failed``.
    ``history``: its per-step metrics (as logged); ``warmup``: its measure.warmup_steps."""

    point: Any  # workbench.sweep.Point
    status: str
    run_id: str | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    warmup: int = 1
    error: str | None = None

    @property
    def summary(self) -> dict[str, float | None]:
        return summarize(self.history, self.warmup)

    def ratios(self, name: str) -> list[float]:
        """The point's per-step paired ratios of speedup ``name`` (``speedup/gen``: the logged
        ``speedup/gen_per_step``, or an older run's per-step ``speedup/gen``) after warm-up (empty
        when not paired)."""
        return after_warmup(per_step_ratios(self.history, name), self.warmup)


@dataclass
class Row:
    """One line of the results table: a point, or its repeats pooled (``outcomes`` in seed order)."""

    outcomes: list[Outcome]
    gen: RatioCI | None = None
    step: RatioCI | None = None
    paired: bool = True  # False: the ~ fallback against the baseline run
    gen_runs: RunsCI | None = None  # the random-effects estimate behind ``gen`` when the row has >= 2 runs
    step_runs: RunsCI | None = None

    @property
    def point(self) -> Any:
        return self.outcomes[0].point

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != "failed"]

    def mean(self, key: str) -> float | None:
        vals = [o.summary.get(key) for o in self.ok]
        vals = [v for v in vals if v is not None]
        return sum(vals) / len(vals) if vals else None


def group_repeats(outcomes: list[Outcome]) -> list[Row]:
    """One Row per point, points that differ only in ``seed`` together (first-seen order)."""
    rows: dict[str, Row] = {}
    for o in outcomes:
        key = repr(sorted((k, v) for k, v in o.point.assignment.items() if k != REPEAT_KEY))
        rows.setdefault(key, Row([])).outcomes.append(o)
    return list(rows.values())


def over_runs(per_run: list[list[float]]) -> RunsCI | None:
    """The random-effects estimate over the runs' per-step ratios (runs without ratios left out), or
    None when fewer than 2 runs have them or a run has no within-run variance (< 2 steps after
    warm-up, or all equal): the caller then pools the steps, as for a single run."""
    runs = [x for x in per_run if x]
    if len(runs) < 2:
        return None
    try:
        return runs_ci(runs)
    except ValueError:
        return None


def paired_interval(per_run: list[list[float]]) -> tuple[RatioCI | None, RunsCI | None]:
    """A row's paired speedup from its runs' per-step ratios: (interval shown, random-effects estimate
    behind it or None): over runs when :func:`over_runs` gives one, else the per-step interval of the
    pooled ratios; (None, None) without ratios."""
    runs = over_runs(per_run)
    if runs is not None:
        return runs.ratio_ci(), runs
    steps = [x for r in per_run for x in r]
    return (ratio_ci(steps) if steps else None), None


def fill_speedups(rows: list[Row]) -> None:
    """Each speculative row's gen/step speedup: paired (:func:`paired_interval`), else the ~ baseline fallback."""
    base = {o.point.key: o for r in rows for o in r.ok if o.point.is_baseline}
    for r in rows:
        if r.point.is_baseline or not r.ok:
            continue
        r.gen, r.gen_runs = paired_interval([o.ratios(M.SPEEDUP_GEN) for o in r.ok])
        if r.gen is not None:
            r.step, r.step_runs = paired_interval([o.ratios(M.SPEEDUP_STEP) for o in r.ok])
            r.paired = True
            continue
        r.paired = False  # not paired: a ratio of means against the baseline run(s), no interval
        pairs = [(base.get(o.point.baseline_key), o) for o in r.ok]
        g = [speedup(b.summary[M.GEN_S], o.summary[M.GEN_S]) for b, o in pairs if b]
        s = [speedup(b.summary[M.STEP_S], o.summary[M.STEP_S]) for b, o in pairs if b]
        g, s = [x for x in g if x], [x for x in s if x]
        r.gen = RatioCI(sum(g) / len(g), None, None, 0, None) if g else None
        r.step = RatioCI(sum(s) / len(s), None, None, 0, None) if s else None


def decide_rows(rows: list[Row], label) -> tuple[Decision, dict[str, Row]]:
    """Best row or tie on gen speedup (workbench.stats.decide); ``label(row)`` names a row."""
    cands = {label(r): r for r in rows if r.gen is not None and not r.point.is_baseline}
    return decide({k: r.gen for k, r in cands.items()}), cands


def fmt_ratio(ci: RatioCI | None, paired: bool = True) -> str:
    """``1.23× [1.18, 1.29]`` (paired, with its 95 % interval), ``~1.23×`` (unpaired), ``-``."""
    if ci is None:
        return "-"
    if not paired:
        return f"~{ci.mean:.2f}×"
    return f"{ci.mean:.2f}×" + (f" [{ci.low:.2f}, {ci.high:.2f}]" if ci.low is not None else "")


def fmt_tau(runs: RunsCI | None) -> str:
    """The between-run spread τ of a row over runs as a percentage (``6.1 %``: exp(τ) - 1), ``-`` without one."""
    return "-" if runs is None else f"{math.expm1(runs.tau) * 100:.1f} %"


# What a row's interval covers, for the sweep table's caption and the report's note.
INTERVAL_NOTE = (
    "n ≥ 2 runs: a random-effects 95 % CI over the runs (DerSimonian–Laird τ², Hartung–Knapp t on n−1 "
    "df), τ: their between-run spread; n = 1: the run's per-step CI, which covers the noise of steps "
    "within this run, not of a repeat (seed=0..2 for a claim that must survive one)"
)


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else f"{v:{spec}}"


def rows_table(axes: list, rows: list[Row], title: str, label) -> Table:
    """Per row: axis values, acceptance, mean seconds, paired speedups with CIs, reward, repeats."""
    dec, cands = decide_rows(rows, label)
    tie = set(dec.tied)
    caption = (
        "acc.len/acc.rate/gen s/step s: means after warm-up; 1st→last: acc.len at step 1 and the last step; "
        "gen×/step×: paired speedup (autoregressive s / speculative s, same prompts, same steps), geometric mean "
        f"[95 % CI]: {INTERVAL_NOTE}; ~: unpaired (baseline run's s / point s, no CI); n: runs (seeds); "
        "reward: last step"
    )
    if dec.best:
        caption += "; ★ best gen× (its CI clears every other point's)"
    elif dec.tied:
        caption += f"; ≈ tie for best gen× (95 % CIs overlap): {', '.join(dec.tied)}"
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=0, show_edge=False, caption=caption)
    numeric = ("acc.len", "1st→last", "acc.rate", "gen s", "step s", "gen×", "step×", "τ", "reward", "n")
    cols = [a for a in axes if a.key not in ("drafter.kind", REPEAT_KEY)]
    for c in ["drafter", *[a.name for a in cols], *numeric, "status"]:
        table.add_column(c, justify="right" if c in numeric else "left", no_wrap=c != "status")
    for r in rows:
        p, name = r.point, label(r)
        mark = " ★" if name == dec.best else (" ≈" if name in tie else "")
        first, last = r.mean(M.ACCEPTANCE_LENGTH_FIRST), r.mean(M.ACCEPTANCE_LENGTH_LAST)
        failed = [o for o in r.outcomes if o.status == "failed"]
        statuses = sorted({o.status for o in r.outcomes})
        status = " ".join(
            {"ok": "[green]ok[/]", "skipped": "[cyan]skipped[/]", "other": "[cyan]other worker[/]"}.get(
                s, "[red]FAILED[/]"
            )
            for s in statuses
        )
        if failed:
            status += " " + (failed[0].error or "")
        table.add_row(
            p.spec.drafter.kind,
            *[p.display(a) for a in cols],
            _fmt(r.mean(M.ACCEPTANCE_LENGTH), ".2f"),
            f"{_fmt(first, '.2f')}→{_fmt(last, '.2f')}" if first is not None else "-",
            _fmt(r.mean(M.ACCEPTANCE_RATE), ".2f"),
            _fmt(r.mean(M.GEN_S)),
            _fmt(r.mean(M.STEP_S)),
            fmt_ratio(r.gen, r.paired) + mark,
            fmt_ratio(r.step, r.paired),
            fmt_tau(r.gen_runs),
            _fmt(r.mean(M.REWARD_FINAL)),
            str(len(r.ok)),
            status,
            style="bold" if name == dec.best else None,
        )
    return table


def _ci_json(ci: RatioCI | None, paired: bool, runs: RunsCI | None = None) -> dict[str, Any]:
    """A row's speedup; ``interval``: ``runs`` (random-effects over the row's runs, ``n`` = runs, with
    ``tau`` in log units and the ``pred95_*`` interval for a new run's estimate) or ``steps`` (the
    per-step interval, ``n`` = steps)."""
    if ci is None:
        return {"mean": None}
    out = {
        "mean": ci.mean,
        "ci95_low": ci.low,
        "ci95_high": ci.high,
        "ci95_halfwidth": ci.half_width,
        "n": ci.n,
        "paired": paired,
        "interval": "runs" if runs else "steps",
    }
    if runs:
        out |= {"tau": runs.tau, "pred95_low": runs.pred_low, "pred95_high": runs.pred_high}
    return out


def rows_json(name: str, spec_path: str, axes: list, fixed: list, rows: list[Row], label) -> dict[str, Any]:
    """The results table as JSON (the parent run's ``results.json``): rows with their points."""
    dec, _ = decide_rows(rows, label)
    return {
        "sweep": name,
        "spec": spec_path,
        "axes": {a.key: list(a.values) for a in axes},
        "fixed": {a.key: a.values[0] for a in fixed},
        "best": dec.best,
        "tie": list(dec.tied),
        "rows": [
            {
                "label": label(r),
                "baseline": r.point.is_baseline,
                "drafter.kind": r.point.spec.drafter.kind,
                "axes": {a.key: r.point.display(a) for a in axes if a.key != REPEAT_KEY},
                M.SPEEDUP_GEN: _ci_json(r.gen, r.paired, r.gen_runs),
                M.SPEEDUP_STEP: _ci_json(r.step, r.paired, r.step_runs),
                "points": [
                    {
                        "point": o.point.key,
                        "seed": o.point.spec.seed,
                        "status": o.status,
                        "run_id": o.run_id,
                        "error": o.error,
                        **o.summary,
                    }
                    for o in r.outcomes
                ],
            }
            for r in rows
        ],
    }


# ----------------------------------------------------------------------------- a sweep plan's tables


def plan_table(plan: SweepPlan, title: str) -> Table:
    """The points that would run, baselines first (``--dry-run``)."""
    fixed = " ".join(a.text for a in plan.fixed)
    cols = [a for a in plan.axes if a.key != "drafter.kind"]
    table = Table(title=title, caption=f"spec {plan.spec_path}" + (f"; fixed: {fixed}" if fixed else ""))
    for col in ("#", "drafter", *[a.name for a in cols], "point"):
        table.add_column(col, justify="right" if col == "#" else "left")
    for i, p in enumerate(plan.points, 1):
        table.add_row(str(i), p.spec.drafter.kind, *[p.display(a) for a in cols], p.key)
    return table


def point_label(row: Row) -> str:
    """A results row's name in tables and ties: ``draft_model k=3`` (axis values, seed left out)."""
    p = row.point
    parts = [p.spec.drafter.kind] + [
        f"{ALIAS_OF.get(k, k)}={v}" for k, v in p.assignment.items() if k not in ("drafter.kind", REPEAT_KEY)
    ]
    return "autoregressive" if p.is_baseline else " ".join(parts)


def sweep_rows(outcomes: list[Outcome]) -> list[Row]:
    rows = group_repeats(outcomes)
    fill_speedups(rows)
    return rows


def results_table(plan: SweepPlan, outcomes: list[Outcome], title: str) -> Table:
    """The results table (:func:`rows_table`) of a sweep's outcomes."""
    return rows_table(plan.axes, sweep_rows(outcomes), title, point_label)


def results_json(name: str, plan: SweepPlan, outcomes: list[Outcome]) -> dict[str, Any]:
    return rows_json(name, plan.spec_path, plan.axes, plan.fixed, sweep_rows(outcomes), point_label)
