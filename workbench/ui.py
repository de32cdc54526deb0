"""`wb ui`: the MLflow UI on the workbench's store, and the URL comparing the last sweep's child runs.

    wb ui                         # mlflow server on sqlite:///mlflow.db at http://127.0.0.1:5000
    wb ui --sweep my-sweep        # compare that sweep's points instead of the newest sweep's
    wb ui --print-url             # print the URLs and exit; no server

The comparison view is MLflow's compare-runs route (a hash route of the UI app, MLflow 3):
``http://HOST:PORT/#/compare-runs?runs=["id",...]&experiments=["id",...]``. Those two are the only
parameters the page reads: its scatter plot opens on the first param against the first metric
(the axes are page state, with no URL parameter to preselect them), so k against speedup cannot be
linked to. Pick ``drafter.k`` and ``speedup/gen`` in its X/Y selectors (``speedup/gen``'s last value
is the run's paired estimate), or open the plot a sweep logs on its parent run
(``speedup_vs_k.png``, :mod:`workbench.sweep.plot`), whose URL ``wb ui`` prints (:func:`artifact_url`).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request

from workbench.tags import TAG_ROLE, TAG_STUDY, TAG_SWEEP
from workbench.tracking import DEFAULT_TRACKING_URI


def default_store(uri: str | None = None) -> str:
    """--backend-store-uri: explicit, else $MLFLOW_TRACKING_URI, else ``sqlite:///mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


WILDCARDS = ("0.0.0.0", "", "::")  # listen on every interface


def base_url(host: str, port: int) -> str:
    """The URL this machine reaches a server listening on ``host`` at (loopback for the wildcards)."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host in ("::", "::1") else host)
    return f"http://{shown}:{port}"


def is_local(host: str) -> bool:
    """Whether ``host`` is a loopback address: a server there is reachable from this machine only."""
    return host == "localhost" or host == "::1" or host.startswith("127.")


def network_url(host: str, port: int) -> str:
    """The URL other machines reach a server listening on ``host`` at: this machine's name for the wildcards."""
    import socket

    name = socket.gethostname() if host in WILDCARDS else (f"[{host}]" if ":" in host else host)
    return f"http://{name}:{port}"


def compare_url(base: str, run_ids: list[str], experiment_ids: list[str]) -> str:
    """MLflow 3's compare-runs view of ``run_ids`` (JSON lists, as the UI itself writes them)."""
    c = (",", ":")
    return (
        f"{base}/#/compare-runs?runs={json.dumps(list(run_ids), separators=c)}"
        f"&experiments={json.dumps(sorted(set(experiment_ids)), separators=c)}"
    )


def experiment_url(base: str, experiment_id: str) -> str:
    return f"{base}/#/experiments/{experiment_id}"


def artifact_url(base: str, experiment_id: str, run_id: str, path: str) -> str:
    """The run page opened on artifact ``path`` (MLflow 3's ``/experiments/ID/runs/ID/artifactPath/PATH`` route)."""
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}/artifactPath/{path}"


def has_artifact(store: str, run_id: str, path: str) -> bool:
    """Whether run ``run_id`` holds a top-level artifact ``path`` (False when the store cannot say)."""
    from mlflow import MlflowClient

    try:
        return path in {f.path for f in MlflowClient(tracking_uri=store).list_artifacts(run_id)}
    except Exception:  # noqa: BLE001 - an unreachable artifact store: just do not offer the link
        return False


def find_group(store: str, name: str | None = None):
    """(parent, child runs) of the sweep/study ``name``, or of the newest sweep/study; None if none.

    ``name`` may also be any parent run's name or id. Read by :class:`workbench.runs.RunReader`:
    RunRecords without histories, one child per sweep point (a resumed point's FINISHED run).
    """
    from workbench.runs import RunNotFound, RunReader, quote

    reader = RunReader(store)
    exp_ids = reader.experiment_ids()
    if not exp_ids:
        return None
    if name:
        filters = [
            f"tags.`{TAG_SWEEP}` = {quote(name)} and tags.`{TAG_ROLE}` = 'parent'",
            f"tags.`{TAG_STUDY}` = {quote(name)}",
            f"attributes.run_name = {quote(name)}",
        ]
    else:
        filters = [f"tags.`{TAG_ROLE}` = 'parent'", f"tags.`{TAG_STUDY}` != ''"]
    parents = [reader.load(r, histories=False) for f in filters for r in reader.top_level(f, exp_ids, max_results=50)]
    if name and not parents:
        try:
            parents = [reader.get(name, histories=False)]
        except RunNotFound:
            return None
    if not parents:
        return None
    parent = max(parents, key=lambda r: r.start_time)
    return parent, reader.children(parent.run_id, [parent.experiment_id], histories=False)


def absolute_store(uri: str, cwd: str | None = None) -> str:
    """``uri`` meaning the same store from any folder: a relative sqlite path or a plain/``file:`` folder
    resolved against ``cwd`` (default: the working directory); other URIs unchanged."""
    cwd = cwd or os.getcwd()
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        rest = uri[len("sqlite:///") :]
        if rest and not rest.startswith(":memory:"):
            return "sqlite:///" + os.path.join(cwd, rest)
        return uri
    if uri.startswith("file:") and not uri.startswith("file:/"):
        return "file:" + os.path.join(cwd, uri[len("file:") :])
    if "://" not in uri and not uri.startswith("file:") and not os.path.isabs(uri):
        return os.path.join(cwd, uri)
    return uri


def server_command(
    store: str, host: str, port: int, workers: int = 1, artifacts_destination: str | None = None
) -> list[str]:
    """``mlflow server`` on ``store`` (:func:`workbench.isolated.python_module`: never an ``mlflow/`` from the
    working directory; :func:`start_server` also runs it in an empty folder, for the uvicorn it starts)."""
    from workbench.isolated import python_module

    args = ["server", "--backend-store-uri", store, "--host", host, "--port", str(port), "--workers", str(workers)]
    if artifacts_destination:
        args += ["--artifacts-destination", artifacts_destination]
    return python_module("mlflow", *args)


def start_server(store: str, host: str, port: int) -> tuple[subprocess.Popen, str]:
    """(the MLflow server process, the empty folder it runs in): MLflow starts uvicorn with ``python -m``,
    and uvicorn imports the app from its working directory first, so the server runs in a fresh empty folder;
    the store and the artifacts destination (``./mlartifacts`` as MLflow's own default, unless
    ``MLFLOW_ARTIFACTS_DESTINATION`` is set) are made absolute from the working directory first."""
    import tempfile

    dest = None if os.environ.get("MLFLOW_ARTIFACTS_DESTINATION") else os.path.abspath("mlartifacts")
    cmd = server_command(absolute_store(store), host, port, artifacts_destination=dest)
    here = tempfile.mkdtemp(prefix="wb-ui-")
    return subprocess.Popen(cmd, cwd=here), here


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
