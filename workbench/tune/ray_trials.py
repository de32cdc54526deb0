"""Study trials as Ray tasks (``wb tune --ray ADDRESS``): this process asks Optuna for each trial and tells
it the result; Ray runs the trial where the cluster has room.

The driver keeps as many trials in flight as the cluster holds (its CPUs over ``--cpus-per-trial``, or its
GPUs for a CUDA spec). For each it asks the study (the ``--trials`` total and surplus rules of
`workbench.tune` hold: other ``wb tune`` workers may share the study), draws the parameters (so they are in
the storage before the task starts) and holds Optuna's heartbeat for it: a driver killed mid-study leaves
stale trials that the next worker fails, as for any worker. The task reopens the study from the same storage,
runs the trial into an MLflow child of the study's parent (`workbench.tune.study.trial_task`: pruning reports go
to the storage from the node) and returns its value. A task whose node dies is retried by Ray on another node,
and the retry first marks the dead attempt's RUNNING MLflow child FAILED; a trial that raises is told FAIL
(it does not count toward ``--trials``), as in a plain worker.

The storage and the MLflow store must be reachable from every node: PostgreSQL (or MySQL) for both, or an
MLflow server; sqlite only on a one-machine cluster (docs/beyond-one-machine.md).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.console import Console

from workbench.ray_cluster import absolute_store, connect, describe, point_resources, task_env
from workbench.runs import quote
from workbench.specs.dotted import set_dotted
from workbench.tags import TAG_STUDY, TAG_TRIAL
from workbench.tune.plan import TunePlan
from workbench.tune.space import reseed_for_trial, suggest
from workbench.tune.workers import (
    active_trials,
    fail_stale,
    optuna_quiet,
    tell,
    trials_before,
)

MAX_RETRIES = 3  # Ray's default: attempts after a worker or node death


def fail_dead_attempts(store: Any, study: str, number: int, node: str) -> None:
    """RUNNING MLflow children of this trial (an attempt whose node died) are ended FAILED, tagged why."""
    filt = f"tags.`{TAG_STUDY}` = {quote(study)} and tags.`{TAG_TRIAL}` = '{number}' and attributes.status = 'RUNNING'"
    for r in store.reader.search(filt, [store.experiment_id]):
        store.fail(r.info.run_id, f"its Ray task's attempt died; retried on node {node}")


def task_plan(plan: TunePlan, tracking_uri: str | None, cwd: str) -> TunePlan:
    """The plan as a task gets it: relative sqlite storage and MLflow store made absolute against ``cwd``."""
    raw = plan.raw
    if tracking_uri:
        raw = set_dotted(raw, "tracking.tracking_uri", absolute_store(tracking_uri, cwd))
    return dataclasses.replace(plan, raw=raw, storage=absolute_store(plan.storage, cwd))


def slots(cluster: dict[str, float], opts: dict[str, float]) -> int:
    """How many trials fit on the cluster at once: its GPUs for a GPU trial, else its CPUs over the trial's."""
    if opts["num_gpus"]:
        return max(1, int(cluster.get("GPU", 0) // opts["num_gpus"]))
    return max(1, int(cluster.get("CPU", 1) // opts["num_cpus"]))


def run_trials_on_ray(
    plan: TunePlan,
    study: optuna.Study,
    store: Any,
    trials: int,
    attempts: int,
    console: Console,
    address: str,
    cpus: float = 1.0,
    task_body: Any = None,
) -> int:
    """Run up to ``attempts`` trials of ``study`` as Ray tasks, as many at once as the cluster holds, until
    the study has ``trials`` COMPLETE+PRUNED+RUNNING trials; returns how many this driver started.
    ``task_body(plan, trial_id, parent_id, cwd)``: what a task runs (`workbench.tune.study.trial_task`), returning
    ``{"state": COMPLETE|PRUNED|FAIL, "value", "error", "node"}``.

    Raises:
        ClusterError: Ray missing or unreachable, or a GPU spec on a cluster without GPUs.
        KeyboardInterrupt: after cancelling the tasks and telling their trials FAIL.
    """
    from optuna.storages._heartbeat import get_heartbeat_thread

    ray = connect(address)
    cluster, cwd = ray.cluster_resources(), os.getcwd()
    opts = point_resources(plan.base.model.device, cpus, cluster.get("GPU", 0.0))
    width, env = slots(cluster, opts), task_env()
    sent = task_plan(plan, store and store.tracking_uri, cwd)
    remote = ray.remote(task_body).options(
        **opts, max_retries=MAX_RETRIES, retry_exceptions=False, scheduling_strategy="SPREAD",
        runtime_env={"env_vars": env} if env else None,
    )  # fmt: skip
    console.print(f"trials on Ray ({address}): {width} at once, {cpus:g} CPUs each; cluster: {describe(ray)}")
    pending: dict[Any, tuple[optuna.Trial, Any]] = {}
    started, asking = 0, True
    try:
        while True:
            while asking and len(pending) < width and started < attempts:
                fail_stale(study)
                if active_trials(study) >= trials:
                    asking = False
                    break
                with optuna_quiet():
                    trial = study.ask()
                beat = get_heartbeat_thread(trial._trial_id, study._storage)
                beat.__enter__()  # held until the trial is told: a driver killed leaves it stale
                if trials_before(study, trial.number) >= trials:  # other workers asked in between
                    trial.set_user_attr("surplus", True)
                    console.print(f"trial {trial.number} not run: the study reached {trials} trials (FAIL, surplus)")
                    tell(study, trial, None, TrialState.FAIL)
                    beat.__exit__(None, None, None)
                    asking = False
                    break
                reseed_for_trial(study, plan.tune, plan.base.seed, trial.number)
                params = {k: suggest(trial, k, p) for k, p in plan.tune.params.items()}
                console.print(f"trial [bold]{trial.number}[/]: {' '.join(f'{k}={v}' for k, v in params.items())}")
                ref = remote.remote(sent, trial._trial_id, store and store.parent_id, cwd)
                pending[ref] = (trial, beat)
                started += 1
            if not pending:
                return started
            ready, _ = ray.wait(list(pending), num_returns=1)
            trial, beat = pending.pop(ready[0])
            try:
                out = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - Ray's retries spent (a node died each time)
                out = {"state": "FAIL", "value": None, "error": f"{type(e).__name__}: {e}", "node": "?"}
            _report(console, trial, out, plan.tune.objective)
            state = TrialState[out["state"]]
            if not tell(study, trial, out["value"], state):
                asking = False
            beat.__exit__(None, None, None)
    except KeyboardInterrupt:
        for ref, (trial, beat) in pending.items():
            ray.cancel(ref, force=True)
            tell(study, trial, None, TrialState.FAIL)
            beat.__exit__(None, None, None)
        raise


def _report(console: Console, trial: optuna.Trial, out: dict[str, Any], objective: str) -> None:
    node = str(out.get("node", "?"))[:8]
    if out["state"] == "COMPLETE":
        console.print(f"trial {trial.number}: {objective} = [bold]{out['value']:.4g}[/] (node {node})")
    elif out["state"] == "PRUNED":
        console.print(f"trial {trial.number}: [yellow]pruned[/] (node {node})")
    else:
        console.print(f"[red]trial {trial.number} failed[/] on node {node}: {out['error']}")
