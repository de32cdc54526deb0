"""Sweep points as Ray tasks (``wb sweep --ray ADDRESS``): Ray schedules, places and retries; MLflow keeps
the results, so ``wb report``, ``wb ui`` and resuming by ``--name`` work as for any sweep.

Each open point is one task (``ray.remote``) asking for the resources its spec needs
(:func:`point_resources`: ``--cpus-per-point`` CPUs, and one GPU when the point's ``model.device`` is CUDA),
spread over the cluster's nodes. A task that raises ends its point FAILED and the sweep goes on (no retry: a
bad spec fails the same way twice); a task whose worker process or node dies is retried by Ray
(``max_retries``) on any node, and the retry first marks the dead attempt's RUNNING child run FAILED (tag
``workbench.sweep.stale``), so every point ends with exactly one FINISHED run. A retry that finds the point
FINISHED (the node died after the run ended) returns it as it is. Each point's run records where it ran:
``workbench.ray.node`` (Ray's node id), ``workbench.host``, ``workbench.ray.pid`` and ``workbench.ray.attempt``.

Ray retries an attempt only once it has declared the attempt dead, so two attempts of a point never run
at once: there are no claims, heartbeats or clocks to keep in step. Ray's own docs cover clusters
(``ray start --head`` / ``ray start --address``, KubeRay, SLURM). Several launchers on one sweep name at once
(``--ray`` and the claims of plain workers) are not supported.

Paths in a spec (``task.path``, a checkpoint folder, a sqlite MLflow store) are read on the node that runs
the point: on a cluster use an MLflow server or PostgreSQL store and a shared folder (docs/beyond-one-machine.md).
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from workbench.sweep.grid import SweepError
from workbench.tags import TAG_ERROR, TAG_HOST

if TYPE_CHECKING:
    from workbench.specs import ExperimentSpec
    from workbench.sweep.run import _Worker

TAG_NODE = "workbench.ray.node"  # Ray's node id of the node that ran the point
TAG_PID = "workbench.ray.pid"  # the Ray worker process that ran it
TAG_ATTEMPT = "workbench.ray.attempt"  # earlier Ray runs of the point in this sweep: 0 first, 1 after a retry, ...
MAX_RETRIES = 3  # Ray's default for tasks: attempts after a worker or node death
ENV_PREFIXES = ("WB_", "HF_", "MLFLOW_", "TRANSFORMERS_", "HUGGINGFACE_")  # passed to every task


def point_resources(spec: ExperimentSpec, cpus: float, cluster_gpus: float) -> dict[str, float]:
    """Ray resources for one point: ``{"num_cpus": cpus, "num_gpus": g}`` with g = 1 for ``model.device``
    ``cuda`` / ``cuda:N`` (Ray sets ``CUDA_VISIBLE_DEVICES``: the point sees its GPU as ``cuda:0``), or for
    ``auto`` on a cluster that has GPUs; else 0.

    Raises:
        SweepError: ``cuda`` on a cluster without GPUs (the task would never be scheduled).
    """
    device = spec.model.device
    gpus = 1.0 if device.startswith("cuda") or (device == "auto" and cluster_gpus > 0) else 0.0
    if gpus and cluster_gpus < gpus:
        raise SweepError(f"model.device={device}: the Ray cluster has no GPU; set model.device=cpu or add GPU nodes")
    return {"num_cpus": cpus, "num_gpus": gpus}


def task_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The driver's ``WB_*``, ``HF_*``, ``MLFLOW_*`` and ``TRANSFORMERS_*`` variables, for every task's
    ``runtime_env`` (a node started by ``ray start`` has its own environment)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES)}


def absolute_store(uri: str, cwd: str) -> str:
    """A relative sqlite URI (``sqlite:///mlflow.db``) made absolute against the driver's ``cwd``, so a task
    writes the driver's store wherever Ray starts it; other URIs unchanged."""
    from sqlalchemy.engine import make_url

    if not uri.startswith("sqlite:"):
        return uri
    db = make_url(uri).database
    if not db or db == ":memory:" or os.path.isabs(db):
        return uri
    return f"sqlite:///{os.path.join(cwd, db)}"


def run_point_task(
    spec_json: str, name: str, parent_id: str, key: str, tags: dict[str, str], cwd: str
) -> dict[str, Any]:
    """The body of one point's Ray task: runs the point into a new child run of the sweep's parent.

    Returns ``{"run_id", "node", "status", "error"}``; status ``ok`` (this attempt ran it), ``done`` (a
    FINISHED run already existed) or ``failed`` (the point raised; its run is FAILED, tagged with the error).
    """
    import ray
    from rich.console import Console

    from workbench.experiment import run_experiment
    from workbench.specs import ExperimentSpec
    from workbench.sweep.store import SweepStore

    if os.path.isdir(cwd):
        os.chdir(cwd)  # relative spec paths mean what they meant to the driver (a shared folder on a cluster)
    ctx = ray.get_runtime_context()
    node = ctx.get_node_id()
    cpus = ctx.get_assigned_resources().get("CPU")
    if cpus:
        import torch

        torch.set_num_threads(max(1, int(cpus)))  # the worker process may have imported torch for another task
    spec = ExperimentSpec.model_validate_json(spec_json)
    store = SweepStore(spec, name)
    store.parent_id = parent_id
    runs = store.point_runs(key)
    finished = [r for r in runs if r.status == "FINISHED"]
    if finished:
        return {"run_id": finished[-1].run_id, "node": node, "status": "done", "error": None}
    for r in runs:
        if r.status == "RUNNING":  # an earlier attempt's run: Ray declared that attempt dead before retrying
            store.fail(r.run_id, f"its Ray task's attempt died (node {r.tags.get(TAG_NODE, '?')}); retried on {node}")
    attempt = sum(1 for r in runs if TAG_NODE in r.tags)
    where = {TAG_NODE: node, TAG_HOST: socket.gethostname(), TAG_PID: str(os.getpid()), TAG_ATTEMPT: str(attempt)}
    tags = {**tags, **where}
    run_id = store.create_claim(spec.tracking.run_name or name, tags)
    try:
        run_experiment(
            spec, console=Console(quiet=True), progress=False, parent_run_id=parent_id, tags=tags, summary=False,
            run_id=run_id,
        )  # fmt: skip
    except Exception as e:  # noqa: BLE001 - the point fails, the sweep goes on; Ray must not retry it
        error = f"{type(e).__name__}: {e}"
        store.end_claim(run_id, "FAILED", {TAG_ERROR: error})
        return {"run_id": run_id, "node": node, "status": "failed", "error": error}
    return {"run_id": run_id, "node": node, "status": "ok", "error": None}


def connect(address: str) -> Any:
    """``ray.init(address)``: ``local`` starts a cluster in this process's machine, ``auto`` joins the one
    ``ray start`` began here (or ``$RAY_ADDRESS``), ``HOST:PORT`` / ``ray://HOST:PORT`` a remote one.

    Raises:
        SweepError: Ray is not installed (the install line), or the cluster cannot be reached.
    """
    try:
        import ray
    except ImportError:
        raise SweepError("--ray needs Ray: pip install 'speculation-workbench[ray]' (or pip install ray)") from None
    if ray.is_initialized():
        return ray
    reachable(address)
    try:
        ray.init(
            address=address, include_dashboard=False, logging_level="WARNING", log_to_driver=True,
            configure_logging=True,
        )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise SweepError(f"--ray {address}: cannot reach a Ray cluster ({str(e).splitlines()[0]}); "
                         "start one with `ray start --head` or use --ray local") from None  # fmt: skip
    return ray


def reachable(address: str, timeout: float = 5.0) -> None:
    """For a ``HOST:PORT`` address, one TCP connection to it (Ray itself waits on an absent cluster for
    minutes, retrying); other addresses (``local``, ``auto``, ``ray://``) are left to Ray.

    Raises:
        SweepError: nothing listens there.
    """
    import socket as sock

    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        sock.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise SweepError(
            f"--ray {address}: no Ray cluster answers there ({e.strerror or e}); start one with "
            "`ray start --head` (it prints the address) or use --ray local"
        ) from None


def run_on_ray(w: _Worker, address: str, cpus: float = 1.0, max_retries: int = MAX_RETRIES) -> None:
    """Run every open point of worker ``w``'s sweep as a Ray task and wait for them all; fills ``w.mine``
    and ``w.errors`` as :meth:`_Worker.work` does, so the sweep's table and close are the same.

    Raises:
        SweepError: Ray missing or unreachable, or a point asking for a GPU the cluster lacks.
        KeyboardInterrupt: after cancelling the tasks and marking their runs KILLED.
    """
    ray = connect(address)
    cluster_gpus = ray.cluster_resources().get("GPU", 0.0)
    cwd, env = os.getcwd(), task_env()
    remote = ray.remote(run_point_task)
    finished = w.store.finished_children(histories=False)
    pending: dict[Any, tuple[int, Any]] = {}
    n = len(w.plan.points)
    for i, p in enumerate(w.plan.points, 1):
        label = p.label(w.plan.axes)
        if p.key in finished:
            w.first_seen[p.key] = "skipped"
            w.console.print(f"[{i}/{n}] {label}: [cyan]skipped[/] (finished in run {finished[p.key].run_id})")
            continue
        spec = p.spec.model_copy(deep=True)
        spec.tracking.run_name = f"{w.name}: {label}"
        spec.tracking.tracking_uri = absolute_store(w.store.tracking_uri, cwd)
        opts = point_resources(spec, cpus, cluster_gpus)
        ref = remote.options(
            **opts, max_retries=max_retries, retry_exceptions=False, scheduling_strategy="SPREAD",
            runtime_env={"env_vars": env} if env else None, name=f"wb-sweep:{label}"[:120],
        ).remote(spec.model_dump_json(), w.name, w.store.parent_id, p.key, w.tags(p), cwd)  # fmt: skip
        pending[ref] = (i, p)
    w.console.print(f"{len(pending)} points sent to Ray ({cpus:g} CPUs each); cluster: {_cluster(ray)}")
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i, p = pending.pop(ready[0])
            _settle(w, i, p, ray, ready[0])
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        for _, p in pending.values():
            for r in w.store.point_runs(p.key):
                if r.status == "RUNNING":
                    w.store.end_claim(r.run_id, "KILLED", {})
        raise


def _settle(w: _Worker, i: int, p: Any, ray: Any, ref: Any) -> None:
    """Record one finished task in ``w`` and print its line."""
    label, n = p.label(w.plan.axes), len(w.plan.points)
    try:
        res = ray.get(ref)
    except Exception as e:  # noqa: BLE001 - retries spent (a node died each time) or the task was unschedulable
        w.errors[p.key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        w.console.print(f"[{i}/{n}] {label}: [red]failed on Ray[/]: {w.errors[p.key]}")
        return
    node = res["node"][:8]
    if res["status"] == "failed":
        w.errors[p.key] = res["error"]
        w.console.print(f"[{i}/{n}] {label}: [red]point failed[/] on node {node}: {res['error']}")
        return
    w.mine.add(res["run_id"])
    w.console.print(f"[{i}/{n}] {label}: [green]done[/] on node {node} (run {res['run_id']})")


def _cluster(ray: Any) -> str:
    alive = [x for x in ray.nodes() if x.get("Alive")]
    res = ray.cluster_resources()
    return f"{len(alive)} nodes, {res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs"


__all__ = ["TAG_ATTEMPT", "TAG_NODE", "TAG_PID", "absolute_store", "connect", "point_resources", "run_on_ray"]
