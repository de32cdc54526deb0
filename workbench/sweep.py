"""`wb sweep`: a grid of experiments, each compared with autoregressive generation (DESIGN.md §7).

    wb sweep k=1..7                              # experiments/sweep.yaml, k = 1, 2, ..., 7
    wb sweep micro drafter=ngram,draft_model k=2,4 grpo.steps=3 --name my-sweep

Grammar (one argument each; pure functions below, no I/O):

- ``KEY=LOW..HIGH``: an integer axis, inclusive (``k=1..7``).
- ``KEY=A,B,C``: an axis over a comma list; each value parsed like a ``wb run`` override.
- ``KEY=VALUE``: a *fixed* override applied to every point (not an axis).
- ``KEY`` is any dotted spec key or an alias: ``k`` = ``drafter.k``, ``drafter`` = ``drafter.kind``,
  ``init`` = ``drafter.init.data``, ``online`` = ``drafter.online.enabled``.

Points are the Cartesian product of the axes. For every combination of the non-drafter axis values
a *baseline* point with ``drafter.kind=none`` is added (and run first), so each point's speedup is
measured against autoregressive generation in the same sweep. Points are deduplicated by their
resolved spec, drafter fields ignored when ``kind=none`` (``k`` means nothing without a drafter).

MLflow: one parent run per sweep (tag ``workbench.sweep`` = name), one child run per point
(``workbench.axis.<key>`` tags, ``workbench.sweep.point`` = hash of the point's resolved spec),
``speedup/gen`` and ``speedup/step`` logged on each child, ``results.json`` on the parent.
Re-running with the same ``--name`` resumes: children already FINISHED are skipped.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from workbench.runs import RunReader, RunRecord
from workbench.spec import ExperimentSpec, SpecError, apply_overrides, read_raw_spec, validate_spec
from workbench.sweep_results import REPEAT_KEY, Outcome, Row, fill_speedups, group_repeats, speedup, summarize  # noqa: F401
from workbench.sweep_results import results_json as _results_json
from workbench.sweep_results import results_table as _results_table

DEFAULT_SWEEP_SPEC = "sweep"
ALIASES = {"k": "drafter.k", "drafter": "drafter.kind", "init": "drafter.init.data", "online": "drafter.online.enabled"}
ALIAS_OF = {v: k for k, v in ALIASES.items()}
MAX_POINTS = 1000

TAG_SWEEP = "workbench.sweep"  # sweep name, on the parent and every child
TAG_ROLE = "workbench.sweep.role"  # "parent" | "point"
TAG_POINT = "workbench.sweep.point"  # hash of the point's resolved spec (children)
TAG_AXIS = "workbench.axis."  # + dotted key: the point's value (children) / all values (parent)
PARENT_RUN_TAG = "mlflow.parentRunId"


_RANGE = re.compile(r"^\s*(-?\d+)\s*\.\.\s*(-?\d+)\s*$")


class SweepError(SpecError):
    """A sweep that cannot be planned: bad axis grammar or a point whose spec is invalid."""


# ----------------------------------------------------------------------------- grammar (pure)


@dataclass(frozen=True)
class Axis:
    """One ``KEY=VALUES`` argument. ``values`` are raw strings, applied like ``wb run`` overrides."""

    name: str  # as typed (``k``)
    key: str  # dotted spec key (``drafter.k``)
    values: tuple[str, ...]
    fixed: bool = False  # a plain KEY=VALUE: one value for every point, not an axis

    @property
    def text(self) -> str:
        return f"{self.name}={','.join(self.values)}"


def resolve_key(name: str) -> str:
    """Alias (``k``, ``drafter``, ``init``) -> dotted spec key; any other name is returned as is."""
    return ALIASES.get(name, name)


def parse_axis(item: str) -> Axis:
    """Parse one sweep argument: ``k=1..7``, ``drafter=ngram,draft_model`` or ``grpo.steps=3``.

    Ranges are integers, inclusive, LOW <= HIGH. A value starting with ``[`` or ``{`` is one YAML
    value (not split on commas). Does not check the key against the spec (see :func:`build_points`).

    Raises:
        SweepError: no ``=``, empty key, no values, an empty list item, or a malformed/empty range;
            the message names the argument and shows the fix.
    """
    if "=" not in item:
        raise SweepError(
            f"sweep argument {item!r} must look like KEY=VALUES, e.g. k=1..7 or drafter=ngram,draft_model "
            "(the spec, if given, comes first)"
        )
    name, raw = (s.strip() for s in item.split("=", 1))
    if not name or any(not p for p in name.split(".")):
        raise SweepError(f"sweep argument {item!r}: empty key; use a dotted spec key such as drafter.k or an alias ({_aliases()})")
    key = resolve_key(name)
    if not raw:
        raise SweepError(f"axis {name!r}: no values; give {name}=LOW..HIGH (e.g. {name}=1..7), {name}=A,B or {name}=VALUE")
    if ".." in raw and not raw.startswith(("[", "{")):
        m = _RANGE.match(raw)
        if not m:
            raise SweepError(
                f"axis {name!r}: bad range {raw!r}; a range is LOW..HIGH with integer ends, inclusive, e.g. {name}=1..7 "
                "(list other values with commas: a,b,c)"
            )
        lo, hi = int(m.group(1)), int(m.group(2))
        if lo > hi:
            raise SweepError(f"axis {name!r}: empty range {raw!r} (LOW {lo} > HIGH {hi}); write it as {name}={hi}..{lo}")
        return Axis(name, key, tuple(str(v) for v in range(lo, hi + 1)))
    if raw.startswith(("[", "{")) or "," not in raw:
        return Axis(name, key, (raw,), fixed=True)
    values = [v.strip() for v in raw.split(",")]
    if any(not v for v in values):
        raise SweepError(f"axis {name!r}: empty value in list {raw!r}; remove the stray comma, e.g. {name}=a,b")
    return Axis(name, key, tuple(dict.fromkeys(values)))  # repeated values once, order kept


def parse_sweep_args(items: list[str]) -> tuple[list[Axis], list[Axis]]:
    """Split sweep arguments into (axes, fixed overrides).

    Raises:
        SweepError: a bad argument (see :func:`parse_axis`) or the same spec key given twice.
    """
    parsed = [parse_axis(i) for i in items]
    seen: dict[str, Axis] = {}
    for a in parsed:
        if a.key in seen:
            raise SweepError(f"{a.key!r} is given twice ({seen[a.key].text} and {a.text}); give it once")
        if not a.fixed and a.key.split(".")[0] == "tracking":
            raise SweepError(f"axis {a.name!r}: tracking.* says where runs are logged, it cannot be an axis; give one value")
        seen[a.key] = a
    return [a for a in parsed if not a.fixed], [a for a in parsed if a.fixed]


def expand_grid(axes: list[Axis]) -> list[dict[str, str]]:
    """Cartesian product of the axes: one ``{key: raw value}`` per point, first axis slowest.

    No axes -> one empty point (the base spec). Raises SweepError above MAX_POINTS points.
    """
    n = 1
    for a in axes:
        n *= len(a.values)
    if n > MAX_POINTS:
        raise SweepError(f"the grid has {n} points (limit {MAX_POINTS}); use fewer axis values")
    return [dict(zip([a.key for a in axes], combo)) for combo in itertools.product(*(a.values for a in axes))]


def is_drafter_key(key: str) -> bool:
    return key.split(".")[0] == "drafter"


def baseline_of(assignment: dict[str, str]) -> dict[str, str]:
    """The autoregressive baseline of a point: its non-drafter values with ``drafter.kind=none``."""
    return {**{k: v for k, v in assignment.items() if not is_drafter_key(k)}, "drafter.kind": "none"}


def with_baselines(grid: list[dict[str, str]]) -> list[dict[str, str]]:
    """Baselines first (one per distinct combination of non-drafter values), then the grid."""
    baselines = {json.dumps(baseline_of(a)): baseline_of(a) for a in grid}
    return [*baselines.values(), *grid]


def point_key(spec: ExperimentSpec) -> str:
    """12-hex hash of what a point measures: the resolved spec without ``tracking`` (where it is
    logged), and with only ``drafter.kind`` when the kind is ``none`` (other drafter fields are unused)."""
    d = spec.model_dump(mode="json")
    d.pop("tracking", None)
    if spec.drafter.kind == "none":
        d["drafter"] = {"kind": "none"}
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


@dataclass
class Point:
    """One experiment of the sweep. ``assignment``: axis key -> raw value (baselines: kind=none)."""

    assignment: dict[str, str]
    spec: ExperimentSpec
    key: str  # point_key(spec)
    baseline_key: str  # point_key of its baseline (== key for a baseline)

    @property
    def is_baseline(self) -> bool:
        return self.spec.drafter.kind == "none"

    def label(self, axes: list[Axis]) -> str:
        """``k=3 drafter=ngram`` (alias names as typed); ``baseline`` parts for kind=none."""
        parts = [f"{a.name}={self.display(a)}" for a in axes if self.display(a) != "-"]
        if self.is_baseline:
            parts = ["baseline (drafter=none)", *[p for p in parts if not p.startswith(("drafter=", "drafter.kind="))]]
        return " ".join(parts) or "base spec"

    def display(self, axis: Axis) -> str:
        """The value shown for an axis: ``-`` for drafter fields of a kind=none point."""
        if self.is_baseline and is_drafter_key(axis.key):
            return "none" if axis.key == "drafter.kind" else "-"
        return self.assignment.get(axis.key, "-")


def dedupe(points: list[Point]) -> list[Point]:
    """Keep the first point of each resolved spec (``Point.key``); order is kept."""
    seen: dict[str, Point] = {}
    for p in points:
        seen.setdefault(p.key, p)
    return list(seen.values())


def _aliases() -> str:
    return ", ".join(f"{a} = {k}" for a, k in ALIASES.items())


def _overrides(assignment: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in assignment.items()]


def _check(raw: dict[str, Any], assignment: dict[str, str], source: str) -> ExperimentSpec:
    return paired_by_default(validate_spec(apply_overrides(raw, _overrides(assignment)), source=source))


def paired_by_default(spec: ExperimentSpec) -> ExperimentSpec:
    """``measure.paired: null`` means on in sweeps and studies (issue #6): every speculative point
    times autoregressive generation of the same prompts in the same steps."""
    if spec.measure.paired is None:
        spec.measure.paired = True
    return spec


def _explain(msg: str) -> str:
    return msg + (f"\n  (sweep aliases: {_aliases()})" if "unknown key" in msg else "")


def build_points(raw: dict[str, Any], axes: list[Axis], fixed: list[Axis]) -> tuple[ExperimentSpec, list[Point]]:
    """Resolve and validate every point: (base spec with the fixed overrides, deduplicated points).

    ``raw`` is the loaded spec YAML (a dict). Baselines come first (see :func:`with_baselines`).

    Raises:
        SweepError: a fixed override or an axis value makes an invalid spec (the message names the
            argument and carries the spec error with the allowed keys/values), or a combination of
            valid values is invalid (the message names the point).
    """
    fixed_assign = {a.key: a.values[0] for a in fixed}
    try:
        base_raw = apply_overrides(raw, _overrides(fixed_assign))
        base = validate_spec(base_raw, source="sweep spec")
    except SpecError as e:
        for a in fixed:  # name the culprit when one override alone is bad
            try:
                _check(raw, {a.key: a.values[0]}, "spec")
            except SpecError as one:
                raise SweepError(_explain(f"override {a.text!r}" + (f" ({a.key})" if a.key != a.name else "") + f": {one}")) from None
        raise SweepError(_explain(f"fixed overrides {' '.join(a.text for a in fixed)}: {e}")) from None

    by_key = {a.key: a for a in axes}
    points: list[Point] = []
    for assignment in with_baselines(expand_grid(axes)):
        try:
            spec = _check(base_raw, assignment, "point")
        except SpecError as e:
            for k, v in assignment.items():
                try:
                    _check(base_raw, {k: v}, "spec")
                except SpecError as one:
                    a = by_key.get(k)
                    name = f"axis {a.name!r}" + (f" ({k})" if k != a.name else "") if a else f"baseline {k}"
                    raise SweepError(_explain(f"{name}, value {v!r}: {one}")) from None
            raise SweepError(_explain(f"point {' '.join(_overrides(assignment))}: {e}")) from None
        base_assign = baseline_of(assignment)
        bkey = point_key(spec) if spec.drafter.kind == "none" else point_key(_check(base_raw, base_assign, "baseline"))
        points.append(Point(assignment, spec, point_key(spec), bkey))
    return base, dedupe(points)


@dataclass
class SweepPlan:
    """What `wb sweep` will run: the spec source, axes, fixed overrides and validated points."""

    spec_path: str
    base: ExperimentSpec
    axes: list[Axis]
    fixed: list[Axis]
    points: list[Point]


def plan_sweep(spec: str | None, items: list[str], repeats: int = 1) -> SweepPlan:
    """Load the spec (default ``experiments/sweep.yaml``), parse the arguments, validate every point.

    ``repeats`` > 1 adds the axis ``seed`` = spec seed .. seed + repeats - 1 (the table pools repeats).

    Raises:
        SweepError / SpecError: anything wrong, before anything runs.
    """
    path, raw = read_raw_spec(spec or DEFAULT_SWEEP_SPEC)
    axes, fixed = parse_sweep_args(items)
    if repeats < 1:
        raise SweepError(f"--repeats {repeats}: give 1 or more")
    if repeats > 1:
        if any(a.key == REPEAT_KEY for a in (*axes, *fixed)):
            raise SweepError("--repeats and a seed= argument both set the seeds; give one of them")
        seed = int(raw.get("seed", 0) or 0)
        axes.append(Axis(REPEAT_KEY, REPEAT_KEY, tuple(str(seed + i) for i in range(repeats))))
    base, points = build_points(raw, axes, fixed)
    return SweepPlan(str(path), base, axes, fixed, points)


# ----------------------------------------------------------------------------- results


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
    parts = [p.spec.drafter.kind] + [f"{ALIAS_OF.get(k, k)}={v}" for k, v in p.assignment.items() if k not in ("drafter.kind", REPEAT_KEY)]
    return "autoregressive" if p.is_baseline else " ".join(parts)


def sweep_rows(outcomes: list[Outcome]) -> list[Row]:
    rows = group_repeats(outcomes)
    fill_speedups(rows)
    return rows


def results_table(plan: SweepPlan, outcomes: list[Outcome], title: str) -> Table:
    """The results table (workbench.sweep_results.results_table) of a sweep's outcomes."""
    return _results_table(plan.axes, sweep_rows(outcomes), title, point_label)


def results_json(name: str, plan: SweepPlan, outcomes: list[Outcome]) -> dict[str, Any]:
    return _results_json(name, plan.spec_path, plan.axes, plan.fixed, sweep_rows(outcomes), point_label)


# ----------------------------------------------------------------------------- orchestration (MLflow)


def _tag_filter(tag: str, value: str) -> str:
    return f"tags.`{tag}` = '{value}'"


class _SweepStore:
    """The sweep's MLflow side: parent run (created or resumed), finished children, derived metrics."""

    def __init__(self, spec: ExperimentSpec, name: str):
        from mlflow import MlflowClient

        from workbench.tracking import _quiet_mlflow, resolve_tracking_uri

        _quiet_mlflow()
        self.tracking_uri = resolve_tracking_uri(spec.tracking.tracking_uri)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.name = name
        exp = self.client.get_experiment_by_name(spec.tracking.experiment)
        if exp is None:
            self.experiment_id = self.client.create_experiment(spec.tracking.experiment)
        else:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            self.experiment_id = exp.experiment_id
        self.parent_id: str | None = None
        self.resumed = False
        self.reader = RunReader(self.tracking_uri, self.client)

    def open_parent(self, tags: dict[str, str]) -> None:
        """Reuse the newest parent run tagged with this sweep name (set RUNNING again), else create it."""
        run = self.reader.find_parent(TAG_SWEEP, self.name, TAG_ROLE, [self.experiment_id])
        if run is not None:
            self.parent_id, self.resumed = run.info.run_id, True
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            self.parent_id = self.client.create_run(self.experiment_id, run_name=self.name, tags={TAG_SWEEP: self.name, TAG_ROLE: "parent"}).info.run_id
        for k, v in tags.items():
            self.client.set_tag(self.parent_id, k, v)

    def finished_children(self) -> dict[str, RunRecord]:
        """point hash -> this parent's FINISHED child run, its history loaded (newest wins)."""
        runs = self.reader.children(self.parent_id, [self.experiment_id], status="FINISHED")
        return {r.tags[TAG_POINT]: r for r in runs if TAG_POINT in r.tags}

    def log_unpaired(self, row: Row, o: Outcome) -> None:
        """``speedup/gen_unpaired`` and ``speedup/step_unpaired`` (baseline run's mean s / the point's)
        on a point run with ``measure.paired=false``, at its last step."""
        from mlflow.entities import Metric

        if row.paired or not o.run_id:
            return
        ts, step = int(time.time() * 1000), o.point.spec.grpo.steps
        vals = (("speedup/gen_unpaired", row.gen), ("speedup/step_unpaired", row.step))
        metrics = [Metric(k, ci.mean, ts, step) for k, ci in vals if ci is not None]
        if metrics:
            self.client.log_batch(o.run_id, metrics=metrics)

    def close(self, status: str, results: dict[str, Any]) -> None:
        self.client.log_dict(self.parent_id, results, "results.json")
        self.client.set_terminated(self.parent_id, status=status)


def default_sweep_name(plan: SweepPlan) -> str:
    return f"{plan.base.name}-sweep-{time.strftime('%Y%m%d-%H%M%S')}"


@dataclass
class SweepResult:
    name: str
    parent_run_id: str | None
    outcomes: list[Outcome]
    status: str  # FINISHED | FAILED | KILLED
    tracking_uri: str | None = None


def run_sweep(plan: SweepPlan, name: str | None = None, console: Console | None = None, progress: bool = True) -> SweepResult:
    """Run every point of ``plan`` (baselines first) as a child of one MLflow parent run.

    A point that raises is logged, marked failed (its child run is FAILED) and the sweep goes on;
    the parent ends FINISHED if every point is done, FAILED if any failed. KeyboardInterrupt marks
    the parent KILLED, logs the partial ``results.json`` and is re-raised. With a ``name`` used
    before (same experiment), the earlier parent is resumed and its FINISHED points are skipped.
    With ``tracking.enabled: false`` nothing is logged and nothing can be resumed.
    """
    from workbench.experiment import run_experiment

    console = console or Console()
    name = name or default_sweep_name(plan)
    store = _SweepStore(plan.base, name) if plan.base.tracking.enabled else None
    done: dict[str, Any] = {}  # point hash -> finished child run (resume)
    if store:
        tags = {TAG_SWEEP: name, TAG_ROLE: "parent", "workbench.spec": plan.base.name, "workbench.sweep.points": str(len(plan.points)),
                "workbench.sweep.fixed": " ".join(a.text for a in plan.fixed)}
        tags.update({TAG_AXIS + a.key: ",".join(a.values) for a in plan.axes})
        store.open_parent(tags)
        done = store.finished_children() if store.resumed else {}
        console.print(f"sweep [bold]{name}[/]: {len(plan.points)} points" + (f", resuming ({len(done)} already finished)" if store.resumed else ""))

    outcomes: list[Outcome] = []
    status = "FAILED"
    try:
        for i, p in enumerate(plan.points, 1):
            label = p.label(plan.axes)
            if p.key in done:
                o = Outcome(p, "skipped", done[p.key].run_id, done[p.key].steps(), p.spec.measure.warmup_steps)
                console.print(f"[{i}/{len(plan.points)}] {label}: [cyan]skipped[/] (finished in run {o.run_id})")
            else:
                console.print(f"[{i}/{len(plan.points)}] [bold]{label}[/]")
                spec = p.spec.model_copy(deep=True)
                spec.tracking.run_name = f"{name}: {label}"
                tags = {TAG_SWEEP: name, TAG_ROLE: "point", TAG_POINT: p.key, "workbench.sweep.baseline": str(p.is_baseline).lower()}
                tags.update({TAG_AXIS + a.key: p.display(a) for a in plan.axes})
                try:
                    r = run_experiment(spec, console=console, progress=progress, parent_run_id=store and store.parent_id,
                                       tags=tags, summary=False)
                    o = Outcome(p, "ok", r.run_id, r.history, p.spec.measure.warmup_steps)
                except Exception as e:  # noqa: BLE001 - one bad point must not stop the sweep
                    o = Outcome(p, "failed", error=f"{type(e).__name__}: {e}")
                    console.print(f"[red]point failed[/] ({label}): {o.error}")
            outcomes.append(o)
            if store and o.status == "ok" and not p.is_baseline:  # baselines run first: known by now
                row = next(r for r in sweep_rows([x for x in outcomes if x.point.key in (p.key, p.baseline_key)]) if not r.point.is_baseline)
                store.log_unpaired(row, o)
        status = "FAILED" if any(o.status == "failed" for o in outcomes) else "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if store:
            store.close(status, results_json(name, plan, outcomes))
    return SweepResult(name, store and store.parent_id, outcomes, status, store and store.tracking_uri)
