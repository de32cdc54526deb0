"""A sweep's MLflow side: the parent run (created, resumed or joined), its children and claims, derived metrics."""

from __future__ import annotations

import os
import time
from typing import Any

from workbench import metrics as M
from workbench.runs import RunReader, RunRecord, quote
from workbench.specs import ExperimentSpec
from workbench.sweep.results import Outcome, Row
from workbench.tags import PARENT_RUN_TAG, TAG_POINT, TAG_ROLE, TAG_STALE, TAG_SWEEP
from workbench.tracking import store_open_lock, system_tags

SCHEMA_RACES = ("already exists", "expected to match one row")  # two processes migrating one new sqlite store
RACES = ("UNIQUE constraint", "IntegrityError", "Duplicate entry", "duplicate key", "database is locked")


def retried(call: Any, *args: Any, tries: int = 5, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, tried again when another worker wrote the same row at the same moment
    (MLflow's set-tag is a select-then-insert: two workers tagging one run with one key race to
    insert it, and the loser's store raises an integrity error; the next try updates the row)."""
    from mlflow.exceptions import MlflowException

    for attempt in range(tries):
        try:
            return call(*args, **kwargs)
        except MlflowException as e:
            if attempt == tries - 1 or not any(r in str(e) for r in RACES):
                raise
            time.sleep(0.2 * (attempt + 1))


def _tag_filter(tag: str, value: str) -> str:
    return f"tags.`{tag}` = '{value}'"


class SweepStore:
    """The sweep's MLflow side: parent run (created, resumed or joined), children and claims, derived metrics.

    ``settle_s``: how long a worker that created a parent waits before reading which parent won.
    """

    settle_s = 2.0

    def __init__(self, spec: ExperimentSpec, name: str):
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        from workbench.tracking import _quiet_mlflow, resolve_tracking_uri

        _quiet_mlflow()
        self.tracking_uri = resolve_tracking_uri(spec.tracking.tracking_uri)
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        self.name = name
        exp = self.client.get_experiment_by_name(spec.tracking.experiment)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(spec.tracking.experiment)
            except MlflowException:  # another worker created it at the same moment (an MLflow server: no file lock)
                exp = self.client.get_experiment_by_name(spec.tracking.experiment)
                if exp is None:
                    raise
        if exp is not None:
            if exp.lifecycle_stage == "deleted":
                self.client.restore_experiment(exp.experiment_id)
            self.experiment_id = exp.experiment_id
        self.parent_id: str | None = None
        self.resumed = False
        self.reader = RunReader(self.tracking_uri, self.client)

    @classmethod
    def open(cls, spec: ExperimentSpec, name: str) -> "SweepStore":
        """The store, opened under `workbench.tracking.store_open_lock` (workers started together on a new
        store would otherwise race through its schema migrations and the experiment's creation)."""
        from workbench.tracking import resolve_tracking_uri

        uri = resolve_tracking_uri(spec.tracking.tracking_uri)
        for attempt in range(3):
            try:
                with store_open_lock(uri):
                    return cls(spec, name)
            except Exception as e:  # noqa: BLE001 - a process outside the lock migrated the new store at the same moment
                if attempt == 2 or not any(r in str(e) for r in SCHEMA_RACES):
                    raise
                time.sleep(2.0)  # its migration finishes; the store then opens as an existing one
        raise AssertionError("unreachable")

    def _parents(self) -> list[Any]:
        return self.reader.top_level(
            f"tags.`{TAG_SWEEP}` = {quote(self.name)} and tags.`{TAG_ROLE}` = 'parent'", [self.experiment_id]
        )

    def open_parent(self, tags: dict[str, str]) -> None:
        """Reuse the newest parent run tagged with this sweep name (set RUNNING again), else create it.

        Workers started together may each create one: after ``settle_s`` every creator lists the
        parents of the name and the earliest (start_time, run_id) wins; a loser deletes its own and
        joins the winner (``resumed`` is then True, as for any parent found)."""
        run = self.reader.find_parent(TAG_SWEEP, self.name, TAG_ROLE, [self.experiment_id])
        if run is not None:
            self.parent_id, self.resumed = run.info.run_id, True
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            mine = self.client.create_run(
                self.experiment_id, run_name=self.name, tags=system_tags({TAG_SWEEP: self.name, TAG_ROLE: "parent"})
            ).info.run_id
            time.sleep(self.settle_s)
            first = min(self._parents(), key=lambda r: (r.info.start_time, r.info.run_id), default=None)
            self.parent_id = first.info.run_id if first is not None else mine
            if self.parent_id != mine:
                self.client.delete_run(mine)
                self.resumed = True
        from mlflow.entities import RunTag

        # every worker writes them
        retried(self.client.log_batch, self.parent_id, tags=[RunTag(k, v) for k, v in tags.items()])

    # ------------------------------------------------------------------ claims (workbench.sweep.claims)

    def point_runs(self, key: str) -> list[RunRecord]:
        """Every child run of the parent for point ``key`` (any status, deleted ones aside), no histories."""
        filt = f"tags.`{PARENT_RUN_TAG}` = '{self.parent_id}' and tags.`{TAG_POINT}` = {quote(key)}"
        return [
            self.reader.load(r, histories=False)
            for r in self.reader.search(filt, [self.experiment_id], newest_first=False)
        ]

    def create_claim(self, run_name: str, tags: dict[str, str]) -> str:
        """A RUNNING child run of the parent with ``tags``: a claim on a point."""
        tags = system_tags({**tags, PARENT_RUN_TAG: self.parent_id})
        return self.client.create_run(self.experiment_id, run_name=run_name, tags=tags).info.run_id

    def fail(self, run_id: str, why: str) -> None:
        """Mark a dead worker's claim FAILED, tagged ``workbench.sweep.stale`` = why."""
        retried(self.client.set_tag, run_id, TAG_STALE, why)  # two workers may fail one claim at once
        self.client.set_terminated(run_id, status="FAILED")

    def drop(self, run_id: str) -> None:
        """A lost claim: ended KILLED (so no reader takes it as live) and deleted."""
        self.client.set_terminated(run_id, status="KILLED")
        self.client.delete_run(run_id)

    def end_claim(self, run_id: str, status: str, tags: dict[str, str]) -> None:
        """End a claim that is still RUNNING (its point raised before its run opened) with ``status``."""
        for k, v in tags.items():
            retried(self.client.set_tag, run_id, k, v[:5000])
        if self.client.get_run(run_id).info.status == "RUNNING":
            self.client.set_terminated(run_id, status=status)

    def finished_children(self, histories: bool = True) -> dict[str, RunRecord]:
        """point hash -> this parent's FINISHED child run, its history loaded (newest wins)."""
        runs = self.reader.children(self.parent_id, [self.experiment_id], status="FINISHED", histories=histories)
        return {r.tags[TAG_POINT]: r for r in runs if TAG_POINT in r.tags}

    def log_unpaired(self, row: Row, o: Outcome) -> None:
        """``speedup/gen_unpaired`` and ``speedup/step_unpaired`` (baseline run's mean s / the point's)
        on a point run with ``measure.paired=false``, at its last step."""
        from mlflow.entities import Metric

        if row.paired or not o.run_id:
            return
        ts, step = int(time.time() * 1000), o.point.spec.grpo.steps
        vals = ((f"{M.SPEEDUP_GEN}_unpaired", row.gen), (f"{M.SPEEDUP_STEP}_unpaired", row.step))
        metrics = [Metric(k, ci.mean, ts, step) for k, ci in vals if ci is not None]
        if metrics:
            self.client.log_batch(o.run_id, metrics=metrics)

    def close(self, status: str, results: dict[str, Any], plot: str | os.PathLike | None = None) -> None:
        """Log ``results.json`` (and ``plot``, a PNG such as ``speedup_vs_k.png``) on the parent and end it
        ``status``."""
        self.client.log_dict(self.parent_id, results, "results.json")
        if plot is not None:
            self.client.log_artifact(self.parent_id, os.fspath(plot))
        self.end_parent(status)

    def end_parent(self, status: str) -> None:
        """End the parent run ``status`` (FINISHED, FAILED, KILLED)."""
        self.client.set_terminated(self.parent_id, status=status)
