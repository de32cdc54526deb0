"""A sweep's MLflow side: the parent run (created or resumed), its finished children, derived metrics."""

from __future__ import annotations

import time
from typing import Any

from workbench.runs import RunReader, RunRecord
from workbench.specs import ExperimentSpec
from workbench.sweep.results import Outcome, Row
from workbench.tags import TAG_POINT, TAG_ROLE, TAG_SWEEP


def _tag_filter(tag: str, value: str) -> str:
    return f"tags.`{tag}` = '{value}'"


class SweepStore:
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
