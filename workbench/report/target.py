"""What a report is about: NAME resolved to a sweep, study, run or run id, and its rows (read from MLflow).

NAME is resolved, in order, as: a sweep (parent run tagged ``workbench.sweep``), an Optuna study
(parent run tagged ``workbench.study``), a run name (a run with child runs is reported as a
parent), or a run id. Any parent run works: its children are the runs tagged
``mlflow.parentRunId`` = its id. Runs are read by :mod:`workbench.runs` (one run per sweep point,
means after the run's ``measure.warmup_steps``, the one baseline rule).

Rows follow the sweep results table (:mod:`workbench.sweep.results`): runs that differ only in
``seed`` are one row; a row's gen/step speedup is the paired geometric mean with its 95 % CI (over
2+ runs a random-effects interval, :func:`workbench.stats.runs_ci`; one run: its per-step CI), else ``~`` baseline s /
point s against :func:`workbench.runs.baseline_for` (no CI, no other setting's baseline); ★ marks the best row
only when :func:`workbench.stats.decide` separates it, otherwise the tie is named.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.runs import RunNotFound, RunReader, RunRecord, UnsearchableName, baseline_for
from workbench.stats import Decision
from workbench.sweep.results import REPEAT_KEY, Outcome, Row, decide_rows, fill_speedups, group_repeats
from workbench.tags import TAG_AXIS, TAG_ROLE, TAG_STUDY, TAG_SWEEP

SHORT = {"drafter.k": "k", "drafter.kind": "drafter", "drafter.init.data": "init", "drafter.online.enabled": "online"}


class ReportError(ValueError):
    """NAME matches nothing, or the store cannot be read; the message lists what exists."""


# ----------------------------------------------------------------------------- data


@dataclass
class RunPoint:
    """A logged run in the shape :mod:`workbench.sweep.results` expects of a sweep ``Point``:
    ``assignment`` (its setting, for pooling repeats), ``key`` (run id), ``baseline_key`` (run id of
    :func:`workbench.runs.baseline_for`, or None) and, for the row it heads, its unique ``label``."""

    run: RunRecord
    assignment: dict[str, str]
    key: str
    baseline_key: str | None
    label: str = ""

    @property
    def is_baseline(self) -> bool:
        return self.run.is_baseline


@dataclass
class Target:
    """What NAME resolved to: ``kind`` is sweep | study | parent | run; ``rows``: the runs grouped
    (repeats pooled) with their speedups filled in."""

    kind: str
    name: str
    parent: RunRecord | None
    runs: list[RunRecord]  # children of the parent (one per point), or the single run
    tracking_uri: str
    experiment: str = ""
    axes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    @property
    def decision(self) -> Decision:
        return decide_rows(self.rows, label)[0]


def short(key: str) -> str:
    return SHORT.get(key, key)


def label(row: Row) -> str:
    """A row's unique name in tables, plots and ties (``ngram k=2``, ``autoregressive``)."""
    return row.point.label


def row_runs(row: Row, ok: bool = True) -> list[RunRecord]:
    """The row's runs (its repeats), only those that did not fail unless ``ok=False``."""
    return [o.point.run for o in (row.ok if ok else row.outcomes)]


def row_mean(row: Row, key: str) -> float | None:
    """Mean over the row's runs of :meth:`RunRecord.mean` (each after its warm-up)."""
    vals = [m for r in row_runs(row) if (m := r.mean(key)) is not None]
    return sum(vals) / len(vals) if vals else None


def online(r: RunRecord) -> bool | None:
    v = r.params.get("drafter.online.enabled")
    return None if v is None else v.strip().lower() in ("true", "1", "yes")


def axis_value(r: RunRecord, axis: str) -> str:
    """A run's value on an axis: its ``workbench.axis.*`` tag, else its param; ``-`` for drafter
    fields of a baseline."""
    if r.is_baseline and axis.startswith("drafter."):
        return "none" if axis == "drafter.kind" else "-"
    return r.tags.get(TAG_AXIS + axis) or r.params.get(axis, "-")


def run_label(r: RunRecord, axes: list[str]) -> str:
    parts = ["autoregressive" if r.is_baseline else r.kind]
    for a in axes:
        v = axis_value(r, a)
        if a not in ("drafter.kind", REPEAT_KEY) and v != "-":
            parts.append(f"{short(a)}={v}")
    return " ".join(parts)


def build_rows(runs: list[RunRecord], axes: list[str]) -> list[Row]:
    """Runs as sweep_results rows: repeats (runs differing only in ``seed``) pooled, gen/step
    speedups filled in by :func:`workbench.sweep.results.fill_speedups`, each row labelled uniquely."""
    outcomes = []
    for r in runs:
        setting = {k: v for k, v in r.params.items() if not k.startswith(("tracking.", "name"))}
        if r.is_baseline:  # a baseline's unused drafter fields do not make it another setting
            setting = {k: v for k, v in setting.items() if not k.startswith("drafter.")} | {"drafter.kind": "none"}
        base = baseline_for(r, runs)
        status = {"FINISHED": "ok", "FAILED": "failed", "KILLED": "failed"}.get(r.status, "running")
        outcomes.append(
            Outcome(
                RunPoint(r, setting, r.run_id, base.run_id if base else None), status, r.run_id, r.steps(), r.warmup
            )
        )
    rows = group_repeats(outcomes)
    fill_speedups(rows)
    seen: dict[str, int] = {}
    for row in rows:
        name = run_label(row.point.run, axes)
        seen[name] = seen.get(name, 0) + 1
        row.point.label = name if seen[name] == 1 else f"{name} #{seen[name]}"
    return rows


def _axes(parent: RunRecord | None, runs: list[RunRecord]) -> list[str]:
    """Axis keys: the parent's / children's ``workbench.axis.*`` tags, else params that differ between runs."""
    keys: list[str] = []
    for r in ([parent] if parent else []) + runs:
        keys += [k[len(TAG_AXIS) :] for k in r.tags if k.startswith(TAG_AXIS)]
    keys = list(dict.fromkeys(keys))
    if keys or len(runs) < 2:
        return keys
    allk = sorted({k for r in runs for k in r.params if not k.startswith(("tracking.", "name"))})
    return [k for k in allk if len({r.params.get(k) for r in runs}) > 1][:6]


def recent_names(reader: RunReader, n: int = 8) -> tuple[list[str], list[str]]:
    """(recent sweep/study names, recent run names) for error messages."""
    parents = reader.search(f"tags.`{TAG_ROLE}` = 'parent'", max_results=n)
    studies = [r for r in reader.top_level("", max_results=200) if TAG_STUDY in r.data.tags][:n]
    groups = list(
        dict.fromkeys([r.data.tags.get(TAG_SWEEP, "") for r in parents] + [r.data.tags[TAG_STUDY] for r in studies])
    )
    runs = list(dict.fromkeys(r.info.run_name for r in reader.search("", max_results=n) if r.info.run_name))
    return [g for g in groups if g], runs


def resolve(name: str, tracking_uri: str | None = None) -> Target:
    """Resolve NAME (sweep, study, parent/run name, run id) and load every run's metrics.

    Raises:
        ReportError: nothing matches; the message lists recent sweeps/studies and runs.
    """
    reader = RunReader(tracking_uri)
    try:
        reader.experiment_ids()
    except Exception as e:  # noqa: BLE001 - unreachable server, unreadable store
        raise ReportError(f"cannot read the MLflow store {reader.uri}: {e}") from None
    try:
        kind, parent, runs = reader.named(name)
    except UnsearchableName as e:
        raise ReportError(str(e)) from None
    except RunNotFound as e:
        groups, recent = recent_names(reader)
        raise ReportError(
            f"{e}\n"
            f"  recent sweeps/studies: {', '.join(groups) or '(none)'}\n"
            f"  recent runs: {', '.join(recent) or '(none)'}\n"
            "  (set the store with --tracking-uri or $MLFLOW_TRACKING_URI)"
        ) from None
    exp = reader.client.get_experiment((parent or runs[0]).experiment_id)
    axes = _axes(parent, runs)
    return Target(kind, name, parent, runs, reader.uri, exp.name, axes, build_rows(runs, axes))
