"""Sweep points as Ray tasks (``wb sweep --ray ADDRESS``): Ray schedules, places and retries; MLflow keeps
the results, so ``wb report``, ``wb ui`` and resuming by ``--name`` work as for any sweep.

Each open point is one task (``ray.remote``) asking for the resources its spec needs
(`workbench.ray_cluster.point_resources`: ``--cpus-per-point`` CPUs, and one GPU when the point's
``model.device`` is CUDA),
spread over the cluster's nodes. A task that raises ends its point FAILED and the sweep goes on (no retry: a
bad spec fails the same way twice); a task whose worker process or node dies is retried by Ray
(``max_retries``) on any node, and the retry first marks the dead attempt's RUNNING child run FAILED (tag
``workbench.sweep.stale``), so every point ends with exactly one FINISHED run. A retry that finds the point
FINISHED (the node died after the run ended) returns it as it is. Each point's run records where it ran:
``workbench.ray.node`` (Ray's node id), ``workbench.host``, ``workbench.ray.pid`` and ``workbench.ray.attempt``.

Ray retries an attempt only once it has declared the attempt dead, so two attempts of a point never run
at once: there are no claims, heartbeats or clocks to keep in step. Several launchers on one sweep name at once
(``--ray`` and the claims of plain workers) are not supported.

Paths in a spec (``task.path``, a checkpoint folder, a sqlite MLflow store) are read on the node that runs
the point: on a cluster use an MLflow server or PostgreSQL store and a shared folder (docs/beyond-one-machine.md).
"""

from __future__ import annotations

import os
import socket
from typing import Any

from workbench.ray_cluster import absolute_store, connect, describe, point_resources, task_env
from workbench.tags import TAG_ERROR, TAG_HOST

TAG_NODE = "workbench.ray.node"  # Ray's node id of the node that ran the point
TAG_PID = "workbench.ray.pid"  # the Ray worker process that ran it
TAG_ATTEMPT = "workbench.ray.attempt"  # earlier Ray runs of the point in this sweep: 0 first, 1 after a retry, ...
MAX_RETRIES = 3  # Ray's default for tasks: attempts after a worker or node death


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


def run_on_ray(w: Any, address: str, cpus: float = 1.0, max_retries: int = MAX_RETRIES) -> None:
    """Run every open point of worker ``w``'s sweep (a `workbench.sweep.run._Worker`) as a Ray task and wait
    for them all; fills ``w.mine`` and ``w.errors`` as its ``work()`` does, so the table and close are the same.

    Raises:
        ClusterError: Ray missing or unreachable, or a point asking for a GPU the cluster lacks.
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
        opts = point_resources(spec.model.device, cpus, cluster_gpus)
        ref = remote.options(
            **opts, max_retries=max_retries, retry_exceptions=False, scheduling_strategy="SPREAD",
            runtime_env={"env_vars": env} if env else None, name=f"wb-sweep:{label}"[:120],
        ).remote(spec.model_dump_json(), w.name, w.store.parent_id, p.key, w.tags(p), cwd)  # fmt: skip
        pending[ref] = (i, p)
    w.console.print(f"{len(pending)} points sent to Ray ({cpus:g} CPUs each); cluster: {describe(ray)}")
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


def _settle(w: Any, i: int, p: Any, ray: Any, ref: Any) -> None:
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


__all__ = ["TAG_ATTEMPT", "TAG_NODE", "TAG_PID", "run_on_ray", "run_point_task"]
