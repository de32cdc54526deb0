"""The one reader of MLflow runs: runs, their children, per-step histories, means and baselines.

    reader = RunReader()                                   # $MLFLOW_TRACKING_URI or sqlite:///mlflow.db
    parent = reader.find_parent("workbench.sweep", "cmp")  # newest parent run of sweep "cmp"
    runs = reader.children(parent.run_id)                  # RunRecords, one per point, histories loaded
    runs[0].mean("timing_s/gen")                           # mean after warm-up
    runs[0].paired_ci("speedup/gen")                       # paired speedup, 95 % CI (from speedup/gen_per_step)
    runs[0].last("reward/mean")                            # value at the last logged step
    baseline_for(runs[3], runs)                            # its autoregressive baseline, or None

Every `wb` command that reads runs (sweep resume, tune, report, project, ui) reads them here, so
there is one rule for each of the questions below; nothing else in the package
calls ``search_runs`` or ``get_metric_history`` (a test checks).

- **Warm-up**: the first ``measure.warmup_steps`` logged steps (param; 1 when absent) are left out
  of every mean and interval, unless that would leave none.
- **One run per point**: a resumed sweep has FAILED and FINISHED children of one point (tag
  ``workbench.sweep.point``): the newest FINISHED one wins, else the newest.
- **Baseline**: a point's autoregressive baseline is a FINISHED run with ``drafter.kind=none`` whose
  params are identical except ``drafter.*``, ``tracking.*``, ``measure.*`` and ``name`` (which say
  how a run is drafted, logged and measured, not what it computes). No other run is a fallback: a
  report never divides by a baseline of another setting. Paired runs need no baseline at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench import metrics as M
from workbench.stats import RatioCI, after_warmup, ratio_ci, ratio_source
from workbench.tags import PARENT_RUN_TAG, TAG_POINT, TAG_ROLE, TAG_STUDY, TAG_SWEEP

# Params that do not change what a run computes (how it drafts, logs, measures, is named).
NOT_SETTING = ("drafter.", "tracking.", "measure.", "name")
EVAL_PREFIXES = (f"{M.EVAL}/", f"{M.EVAL_SAMPLED}/")  # logged at step 0 too (before training)


class RunNotFound(ValueError):
    """A run id or name, or a tagged parent, that the store does not hold."""


@dataclass
class RunRecord:
    """One MLflow run: params, tags, latest metrics and per-step histories (``key -> [(step, value)]``,
    steps >= 1, ascending; the held-out evals ``eval/*``, ``eval_sampled/*`` from step 0, before training)."""

    run_id: str
    name: str
    status: str
    experiment_id: str
    params: dict[str, str]
    tags: dict[str, str]
    metrics: dict[str, float]
    start_time: int = 0
    history: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.params.get("drafter.kind", self.tags.get("workbench.drafter", "none"))

    @property
    def is_baseline(self) -> bool:
        return self.kind == "none"

    @property
    def k(self) -> int | None:
        try:
            return None if self.is_baseline else int(self.params["drafter.k"])
        except (KeyError, ValueError):
            return None

    @property
    def warmup(self) -> int:
        try:
            return int(self.params.get("measure.warmup_steps", 1))
        except ValueError:
            return 1

    def series(self, key: str, warmup: bool = True) -> list[float]:
        """Per-step values of ``key`` (steps >= 1), the warm-up steps dropped unless ``warmup=False``."""
        vals = [v for s, v in self.history.get(key, []) if s >= 1]
        return after_warmup(vals, self.warmup) if warmup else vals

    def mean(self, key: str) -> float | None:
        """Mean of ``key`` after warm-up; None if it was never logged."""
        vals = self.series(key)
        return sum(vals) / len(vals) if vals else None

    def steps(self) -> list[dict[str, float]]:
        """The history as one dict per step (steps >= 1), in step order."""
        by: dict[int, dict[str, float]] = {}
        for key, pts in self.history.items():
            for s, v in pts:
                if s >= 1:
                    by.setdefault(s, {})[key] = v
        return [by[s] for s in sorted(by)]

    def last(self, key: str) -> float | None:
        """The value of ``key`` at its last logged step (e.g. the final ``reward/mean``); None if never logged."""
        pts = self.history.get(key)
        return pts[-1][1] if pts else self.metrics.get(key)

    def tail_mean(self, key: str, n: int = 3) -> float | None:
        """Mean of the last ``n`` logged values of ``key`` (warm-up not dropped); None if never logged."""
        vals = self.series(key, warmup=False)[-n:]
        return sum(vals) / len(vals) if vals else None

    def paired_ci(self, key: str = "speedup/gen") -> RatioCI | None:
        """The run's paired speedup ``key`` (``speedup/gen`` or ``speedup/step``) with its 95 % interval,
        from its per-step ratios ``{key}_per_step`` after warm-up (a run stored before those were logged: the
        per-step ``key`` itself, workbench.stats.ratio_source); None if the run was not paired."""
        vals = [v for v in self.series(ratio_source(self.history, key)) if v > 0]
        return ratio_ci(vals) if vals else None


def latest_per_point(records: Iterable[RunRecord]) -> list[RunRecord]:
    """One record per ``workbench.sweep.point`` tag (untagged runs each stand alone): the newest
    FINISHED one, else the newest. Order: first appearance by start time."""
    by: dict[str, RunRecord] = {}
    for r in sorted(records, key=lambda r: r.start_time):
        key = r.tags.get(TAG_POINT, r.run_id)
        old = by.get(key)
        if old is None or r.status == "FINISHED" or old.status != "FINISHED":
            by[key] = r
    return list(by.values())


def same_setting(a: RunRecord, b: RunRecord) -> bool:
    """Identical params except the NOT_SETTING ones."""
    keys = {k for k in (*a.params, *b.params) if not k.startswith(NOT_SETTING)}
    return all(a.params.get(k) == b.params.get(k) for k in keys)


def baseline_for(run: RunRecord, runs: Iterable[RunRecord]) -> RunRecord | None:
    """The FINISHED ``drafter.kind=none`` run of the same setting (see the module docstring), or None.

    Duck-typed: any records with ``run_id``, ``status``, ``params`` and ``is_baseline`` work."""
    return next(
        (
            b
            for b in runs
            if b.is_baseline and b.status == "FINISHED" and b.run_id != run.run_id and same_setting(run, b)
        ),
        None,
    )


class UnsearchableName(RunNotFound):
    """A name MLflow's filter syntax cannot spell: one ending in a backslash or holding both kinds of quote."""


def quote(v: str) -> str:
    """``v`` as a string literal of an MLflow filter, quotes included.

    MLflow's filter parser has no escapes: a value is the text between its quotes (``\\'`` and ``''`` stay
    as written), and a backslash before a quote takes the quote into the string. So ``v`` is put in single
    quotes when it holds none, else in double quotes.

    Raises:
        UnsearchableName: ``v`` ends in a backslash or holds both ' and " (the message says so, one line).
    """
    if not v.endswith("\\"):
        if "'" not in v:
            return f"'{v}'"
        if '"' not in v:
            return f'"{v}"'
    raise UnsearchableName(
        f"{v!r} cannot be looked up in MLflow: its filter syntax has no escapes, so a name may not end in a "
        "backslash or hold both ' and \"; use another name"
    )


class RunReader:
    """Reads one MLflow store (URI: explicit, else $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).

    Raises:
        RunNotFound: from :meth:`get` / :meth:`find_parent` (``required=True``) when nothing matches.
    """

    def __init__(self, tracking_uri: str | None = None, client: Any = None):
        from mlflow import MlflowClient

        from workbench.tracking import _quiet_mlflow, resolve_tracking_uri

        self.uri = resolve_tracking_uri(tracking_uri)
        self.client = client or MlflowClient(tracking_uri=self.uri)
        _quiet_mlflow()

    # ------------------------------------------------------------------ raw queries (the only ones)

    def experiment_ids(self) -> list[str]:
        from mlflow.entities import ViewType

        return [
            e.experiment_id for e in self.client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000)
        ]

    def search(
        self,
        filter_string: str = "",
        experiment_ids: list[str] | None = None,
        newest_first: bool = True,
        max_results: int = 1000,
    ) -> list[Any]:
        """MLflow ``Run`` objects matching ``filter_string`` (all active experiments by default)."""
        ids = experiment_ids if experiment_ids is not None else self.experiment_ids()
        if not ids:
            return []
        order = ["attributes.start_time DESC" if newest_first else "attributes.start_time ASC"]
        return self.client.search_runs(ids, filter_string, order_by=order, max_results=max_results)

    def history(self, run_id: str, key: str) -> list[tuple[int, float]]:
        """``[(step, value)]`` of one metric, ascending by step."""
        return sorted((m.step, m.value) for m in self.client.get_metric_history(run_id, key))

    # ------------------------------------------------------------------ records

    def load(self, run: Any, histories: bool = True, prefixes: tuple[str, ...] = M.HISTORY_PREFIXES) -> RunRecord:
        """A RunRecord of an MLflow ``Run``; with ``histories``, every metric under ``prefixes``."""
        rec = RunRecord(
            run.info.run_id,
            run.info.run_name or run.info.run_id,
            run.info.status,
            run.info.experiment_id,
            dict(run.data.params),
            dict(run.data.tags),
            dict(run.data.metrics),
            run.info.start_time or 0,
        )
        if histories:
            for key in rec.metrics:
                if key.startswith(prefixes):
                    # step 0 is the trainer's eval before any update; every other history starts at step 1
                    first = 0 if key.startswith(EVAL_PREFIXES) else 1
                    rec.history[key] = [(s, v) for s, v in self.history(rec.run_id, key) if s >= first]
        return rec

    def get(self, id_or_name: str, histories: bool = True) -> RunRecord:
        """A run by id, else the newest run of that name."""
        try:
            return self.load(self.client.get_run(id_or_name), histories)
        except Exception:  # noqa: BLE001 - not an id: look it up by name
            hits = self.search(f"attributes.run_name = {quote(id_or_name)}", max_results=1)
            if not hits:
                raise RunNotFound(f"no MLflow run with id or name {id_or_name!r} in {self.uri}") from None
            return self.load(hits[0], histories)

    def top_level(
        self, filter_string: str = "", experiment_ids: list[str] | None = None, max_results: int = 1000
    ) -> list[Any]:
        """MLflow ``Run`` objects matching ``filter_string`` that are not children of another run, newest first."""
        return [
            r
            for r in self.search(filter_string, experiment_ids, max_results=max_results)
            if PARENT_RUN_TAG not in r.data.tags
        ]

    def experiment_runs(self, name: str, histories: bool = True) -> list[RunRecord]:
        """The top-level runs of the MLflow experiment ``name``, oldest first ([] if none or no such experiment)."""
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            return []
        found = self.search("", [exp.experiment_id], newest_first=False, max_results=10_000)
        return [self.load(r, histories) for r in found if PARENT_RUN_TAG not in r.data.tags]

    def find_parent(
        self,
        tag: str,
        value: str,
        role_tag: str | None = None,
        experiment_ids: list[str] | None = None,
        required: bool = False,
    ) -> Any | None:
        """The newest top-level run tagged ``tag = value`` (and ``role_tag = parent`` if given), as an
        MLflow Run, or None (RunNotFound if ``required``)."""
        filt = f"tags.`{tag}` = {quote(value)}" + (f" and tags.`{role_tag}` = 'parent'" if role_tag else "")
        hits = self.top_level(filt, experiment_ids)
        if not hits and required:
            raise RunNotFound(f"no run tagged {tag}={value!r} in {self.uri}")
        return hits[0] if hits else None

    def children(
        self,
        parent_id: str,
        experiment_ids: list[str] | None = None,
        status: str | None = None,
        histories: bool = True,
        one_per_point: bool = True,
    ) -> list[RunRecord]:
        """The child runs of ``parent_id`` (oldest first), optionally only those of ``status``, one per
        point (:func:`latest_per_point`) unless ``one_per_point=False``."""
        filt = f"tags.`{PARENT_RUN_TAG}` = '{parent_id}'" + (f" and attributes.status = '{status}'" if status else "")
        recs = [
            self.load(r, histories) for r in self.search(filt, experiment_ids, newest_first=False, max_results=10_000)
        ]
        return latest_per_point(recs) if one_per_point else recs

    def has_children(self, run_id: str, experiment_id: str) -> bool:
        return bool(self.search(f"tags.`{PARENT_RUN_TAG}` = '{run_id}'", [experiment_id], max_results=1))

    def named(self, name: str, histories: bool = True) -> tuple[str, RunRecord | None, list[RunRecord]]:
        """What NAME names, as ``(kind, parent, runs)``: kind ``sweep`` or ``study`` (the newest parent
        tagged with it), ``parent`` (a run, by name or id, with children), ``run``, or ``experiment``
        (an MLflow experiment's top-level runs, e.g. one spec run at several seeds by `wb run`);
        ``runs`` the parent's children (one per point, oldest first), the one run, or the experiment's
        runs (oldest first).

        Raises:
            RunNotFound: no sweep, study, run name, run id or experiment NAME.
        """
        parent, kind = self.find_parent(TAG_SWEEP, name, TAG_ROLE), "sweep"
        if parent is None:
            parent, kind = self.find_parent(TAG_STUDY, name), "study"
        if parent is not None:
            parent = self.load(parent, histories=False)
        else:
            try:
                parent, kind = self.get(name, histories=False), "parent"
            except RunNotFound:
                runs = self.experiment_runs(name, histories)
                if runs:
                    return "experiment", None, runs
                raise RunNotFound(f"no sweep, study, run name, run id or experiment {name!r} in {self.uri}") from None
            if not self.has_children(parent.run_id, parent.experiment_id):
                return "run", None, [self.get(parent.run_id) if histories else parent]
        return kind, parent, self.children(parent.run_id, [parent.experiment_id], histories=histories)
