"""`wb ui`: the MLflow UI on the workbench's store, and the URL comparing the last sweep's child runs.

    wb ui                         # mlflow server on sqlite:///mlflow.db at http://127.0.0.1:5000
    wb ui --sweep my-sweep        # compare that sweep's points instead of the newest sweep's
    wb ui --print-url             # print the URLs and exit; no server

The comparison view is MLflow's compare-runs route (a hash route of the UI app, MLflow 3):
``http://HOST:PORT/#/compare-runs?runs=["id",...]&experiments=["id",...]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from workbench.tracking import DEFAULT_TRACKING_URI

TAG_SWEEP = "workbench.sweep"
TAG_ROLE = "workbench.sweep.role"
TAG_STUDY = "workbench.study"
PARENT_RUN_TAG = "mlflow.parentRunId"


def default_store(uri: str | None = None) -> str:
    """--backend-store-uri: explicit, else $MLFLOW_TRACKING_URI, else ``sqlite:///mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def base_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host in ("::", "::1") else host)
    return f"http://{shown}:{port}"


def compare_url(base: str, run_ids: list[str], experiment_ids: list[str]) -> str:
    """MLflow 3's compare-runs view of ``run_ids`` (JSON lists, as the UI itself writes them)."""
    c = (",", ":")
    return f"{base}/#/compare-runs?runs={json.dumps(list(run_ids), separators=c)}&experiments={json.dumps(sorted(set(experiment_ids)), separators=c)}"


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}"


def find_group(store: str, name: str | None = None):
    """(parent run, child runs) of the sweep/study ``name``, or of the newest sweep/study; None if none.

    ``name`` may also be any parent run's name or id. Children: runs tagged ``mlflow.parentRunId``.
    """
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    from workbench.tracking import _quiet_mlflow

    client = MlflowClient(tracking_uri=store)
    _quiet_mlflow()
    exp_ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY, max_results=1000)]
    if not exp_ids:
        return None
    order = ["attributes.start_time DESC"]
    if name:
        filters = [f"tags.`{TAG_SWEEP}` = '{name}' and tags.`{TAG_ROLE}` = 'parent'", f"tags.`{TAG_STUDY}` = '{name}'",
                   f"attributes.run_name = '{name}'"]
    else:
        filters = [f"tags.`{TAG_ROLE}` = 'parent'", f"tags.`{TAG_STUDY}` != ''"]
    parents = []
    for f in filters:
        parents += [r for r in client.search_runs(exp_ids, f, order_by=order, max_results=50) if PARENT_RUN_TAG not in r.data.tags]
    if name and not parents:
        try:
            parents = [client.get_run(name)]
        except Exception:  # noqa: BLE001 - not a run id
            return None
    if not parents:
        return None
    parent = max(parents, key=lambda r: r.info.start_time or 0)
    kids = client.search_runs([parent.info.experiment_id], f"tags.`{PARENT_RUN_TAG}` = '{parent.info.run_id}'",
                              order_by=["attributes.start_time ASC"], max_results=1000)
    return parent, kids


def server_command(store: str, host: str, port: int, workers: int = 1) -> list[str]:
    return [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--host", host,
            "--port", str(port), "--workers", str(workers)]


def wait_ready(base: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> bool:
    """Poll ``/health`` until it answers 200 (True), the process exits or ``timeout`` s pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False
