"""Running a `wb tune` study: Optuna ask/tell over trials, each an MLflow child run (see the package docstring)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.console import Console

from workbench.console import make_console
from workbench.specs import SpecError
from workbench.sweep.store import SweepStore, retried
from workbench.tags import TAG_HOST, TAG_PARAM, TAG_STUDY, TAG_TRIAL
from workbench.tags import TAG_TUNE_ROLE as TAG_ROLE
from workbench.tracking import system_tags
from workbench.tune.plan import PAIRED_KEY, TunePlan
from workbench.tune.score import (
    Score,
    TrialPrunedStop,
    best_trial,
    fmt_score,
    objective_score,
    pruning_hook,
    results_json,
)
from workbench.tune.space import make_pruner, make_sampler, reseed_for_trial, suggest
from workbench.tune.workers import (
    active_trials,
    counted_trials,
    fail_stale,
    heartbeat,
    make_storage,
    optuna_quiet,
    tell,
    trials_before,
    wait_for_others,
)

# ----------------------------------------------------------------------------- study


def open_study(plan: TunePlan, storage: optuna.storages.BaseStorage | None = None) -> optuna.Study:
    """Create the study or load it by name (resume); its objective must match the spec's.

    Raises:
        SpecError: the stored study optimizes another objective.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=plan.name,
        storage=storage or make_storage(plan.storage),
        direction=plan.tune.direction,
        load_if_exists=True,
        sampler=make_sampler(plan.tune, plan.base.seed),
        pruner=make_pruner(plan.tune, plan.base.measure.warmup_steps),
    )
    stored = study.user_attrs.get("objective")
    if stored is None:  # two workers may both write it: same value
        study.set_user_attr("objective", plan.tune.objective)
        study.set_user_attr("spec", plan.spec_path)
    elif stored != plan.tune.objective:
        raise SpecError(
            f"study {plan.name!r} in {plan.storage} optimizes {stored}, not {plan.tune.objective}: "
            f"set tune.objective={stored} or use another --study name"
        )
    return study


# ----------------------------------------------------------------------------- MLflow


class _StudyStore(SweepStore):
    """The sweep's MLflow helper, with the parent run found by ``workbench.study`` instead."""

    def open_parent(self, tags: dict[str, str]) -> None:
        """Reuse the study's newest parent run (set RUNNING again), else create one."""
        run = self.reader.find_parent(TAG_STUDY, self.name, TAG_ROLE, [self.experiment_id])
        if run is not None:
            self.parent_id, self.resumed = run.info.run_id, True
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            mine = self.client.create_run(
                self.experiment_id, run_name=f"tune {self.name}", tags=system_tags(tags)
            ).info.run_id
            newest = self.reader.find_parent(TAG_STUDY, self.name, TAG_ROLE, [self.experiment_id])
            self.parent_id = newest.info.run_id if newest is not None else mine
            if (
                self.parent_id != mine
            ):  # another worker created one at the same moment: join the newest (reports read it)
                self.client.set_tag(mine, TAG_ROLE, "duplicate")
                self.client.set_tag(mine, "workbench.tune.duplicate_of", self.parent_id)
                self.client.set_terminated(mine, status="FINISHED")
        for k, v in tags.items():
            retried(self.client.set_tag, self.parent_id, k, v)  # two workers tagging one parent race (retried)

    def log(self, run_id: str | None, metrics: dict[str, float | None], step: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = [Metric(k, float(v), ts, step) for k, v in metrics.items() if v is not None]
        if run_id and items:
            self.client.log_batch(run_id, metrics=items)


def _open_store(plan: TunePlan) -> _StudyStore:
    """The study's MLflow store, opened under the sqlite file lock that sweeps use (`SweepStore.open`)."""
    return _StudyStore.open(plan.base, plan.name)


# ----------------------------------------------------------------------------- orchestration


@dataclass
class TuneResult:
    name: str
    study: optuna.Study  # read back from storage after every worker's trials ended
    parent_run_id: str | None
    tracking_uri: str | None
    status: str  # FINISHED | KILLED | FAILED
    ran: int  # trials run by this worker


def _record(trial: optuna.Trial, store: _StudyStore | None, run_id: str | None, score: Score, steps: int) -> None:
    """The trial's value, interval and run id as user attrs, and as metrics on its MLflow child."""
    trial.set_user_attr("mlflow_run_id", run_id)
    trial.set_user_attr("n_steps", score.n)
    trial.set_user_attr("steps", steps)
    if score.low is not None:
        trial.set_user_attr("ci95_low", score.low)
        trial.set_user_attr("ci95_high", score.high)
    if store:
        store.log(
            run_id,
            {
                "tune/objective": score.value,
                "tune/objective_ci95_low": score.low,
                "tune/objective_ci95_high": score.high,
            },
            step=steps,
        )


def evaluate(plan: TunePlan, trial: optuna.Trial, store: _StudyStore | None, console: Console, progress: bool) -> float:
    """Run one trial as an MLflow child and return its objective.

    Raises:
        TrialPrunedStop: the pruner stopped it (its score is recorded first).
        ValueError: the run logged nothing the objective can be computed from.
        Exception: whatever run_experiment raises.
    """
    from workbench import experiment

    obj = plan.tune.objective
    params = {k: suggest(trial, k, p) for k, p in plan.tune.params.items()}
    label = " ".join(f"{k}={v}" for k, v in params.items())
    spec = plan.trial_spec(params)
    warmup, kind = spec.measure.warmup_steps, spec.drafter.kind
    console.print(f"trial [bold]{trial.number}[/]: {label} (host {socket.gethostname()})")
    spec.tracking.run_name = f"{plan.name}: trial {trial.number}"
    tags = {
        TAG_STUDY: plan.name,
        TAG_ROLE: "trial",
        TAG_TRIAL: str(trial.number),
        TAG_HOST: socket.gethostname(),
        **{TAG_PARAM + k: str(v) for k, v in params.items()},
    }
    try:
        r = experiment.run_experiment(
            spec,
            console=console,
            progress=progress,
            parent_run_id=store and store.parent_id,
            tags=tags,
            summary=False,
            on_step=pruning_hook(trial, obj, warmup, kind),
        )
    except TrialPrunedStop as e:
        _record(trial, store, e.run_id, e.score, e.step)
        console.print(f"trial {trial.number}: [yellow]pruned[/] at step {e.step} ({obj} {fmt_score(e.score)})")
        raise
    score = objective_score(obj, r.history, warmup, kind)
    if score is None:
        raise ValueError(
            f"objective {obj} could not be computed: the run logged no {PAIRED_KEY.get(obj, 'gen/tokens_per_s')}"
        )
    _record(trial, store, r.run_id, score, len(r.history))
    console.print(f"trial {trial.number}: {obj} = [bold]{fmt_score(score)}[/]")
    return score.value


def run_study(
    plan: TunePlan,
    trials: int,
    console: Console | None = None,
    progress: bool = True,
    storage: optuna.storages.BaseStorage | None = None,
    ray: str | None = None,
    cpus_per_trial: float = 1.0,
) -> TuneResult:
    """Top the study up to ``trials`` COMPLETE+PRUNED trials in total over all its workers.

    An ask/tell loop (see the module docstring for the rules): a trial that raises is printed and
    marked FAIL, and the loop goes on; a surplus trial ends it. Then waits for trials RUNNING in
    other workers and reads the study back from storage. ``storage``: an Optuna storage to use
    instead of ``plan.storage`` (tests). ``ray``: a Ray address (``local``, ``auto``, ``HOST:PORT``): the trials
    run as Ray tasks of ``cpus_per_trial`` CPUs, as many at once as the cluster holds
    (`workbench.tune.ray_trials`).

    Raises:
        KeyboardInterrupt: after marking the running trial FAIL and the MLflow parent KILLED.
        SpecError: the stored study optimizes another objective.
    """
    console = console or make_console()
    storage = storage or make_storage(plan.storage)
    study = open_study(plan, storage)
    fail_stale(study)
    done, active = counted_trials(study), active_trials(study)
    attempts = max(0, trials - done)
    store = _open_store(plan) if plan.base.tracking.enabled else None
    if store:
        tags = {
            TAG_STUDY: plan.name,
            TAG_ROLE: "parent",
            "workbench.spec": plan.base.name,
            "workbench.tune.objective": plan.tune.objective,
            "workbench.tune.storage": plan.storage,
        }
        tags.update({TAG_PARAM + k: p.model_dump_json() for k, p in plan.tune.params.items()})
        store.open_parent(tags)
    others = f", {active - done} running in other workers" if active > done else ""
    console.print(
        f"study [bold]{plan.name}[/] ({plan.storage}): maximize {plan.tune.objective}; "
        f"{done} trials done{others}, {max(0, trials - active)} to run (target {trials})"
    )
    status, ran, final = "FAILED", 0, study
    try:
        if ray:
            from workbench.tune.ray_trials import run_trials_on_ray

            ran = run_trials_on_ray(plan, study, store, trials, attempts, console, ray, cpus_per_trial, trial_task)
        else:
            ran = _trials_here(plan, study, store, trials, attempts, console, progress)
        wait_for_others(study, console)
        final = optuna.load_study(study_name=plan.name, storage=storage)  # every worker's trials, as stored
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if store:
            best = best_trial(final)
            if best is not None:
                retried(store.client.set_tag, store.parent_id, "workbench.tune.best_trial", str(best.number))
                store.log(store.parent_id, {"tune/best_objective": best.value}, step=best.number)
            store.close(status, results_json(plan, final))
    return TuneResult(plan.name, final, store and store.parent_id, store and store.tracking_uri, status, ran)


def trial_task(plan: TunePlan, trial_id: int, parent_id: str | None, cwd: str) -> dict[str, Any]:
    """The body of one trial's Ray task (`workbench.tune.ray_trials`): reopens the study, runs the trial asked
    by the driver into an MLflow child of ``parent_id`` and returns ``{"state": COMPLETE|PRUNED|FAIL, "value",
    "error", "node"}``; a trial that raises is FAIL with the error, never raised (Ray must not retry it)."""
    import ray

    from workbench.tune.ray_trials import fail_dead_attempts

    if os.path.isdir(cwd):
        os.chdir(cwd)
    ctx = ray.get_runtime_context()
    cpus = ctx.get_assigned_resources().get("CPU")
    if cpus:
        import torch

        torch.set_num_threads(max(1, int(cpus)))
    study = open_study(plan, make_storage(plan.storage))
    trial = optuna.trial.Trial(study, trial_id)
    node = ctx.get_node_id()
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr("ray_node", node)
    store = None
    if plan.base.tracking.enabled:
        store = _open_store(plan)
        store.parent_id = parent_id
        fail_dead_attempts(store, plan.name, trial.number, node)
    out = {"state": "FAIL", "value": None, "error": None, "node": node}
    try:
        out.update(state="COMPLETE", value=evaluate(plan, trial, store, Console(quiet=True), False))
    except optuna.TrialPruned:
        out.update(state="PRUNED")
    except Exception as e:  # noqa: BLE001 - the trial fails, the study goes on; Ray must not retry it
        out.update(error=f"{type(e).__name__}: {e}")
    return out


def _trials_here(
    plan: TunePlan, study: optuna.Study, store: _StudyStore | None, trials: int, attempts: int, console: Console,
    progress: bool,
) -> int:  # fmt: skip
    """This process's ask/tell loop: at most ``attempts`` trials, one at a time; returns how many it ran."""
    host, pid, ran = socket.gethostname(), os.getpid(), 0
    for _ in range(attempts):
        fail_stale(study)
        if active_trials(study) >= trials:
            break
        with optuna_quiet():
            trial = study.ask()
        with heartbeat(study, trial):  # from the ask on: a worker killed at any point leaves a stale trial
            if trials_before(study, trial.number) >= trials:  # other workers asked in between
                trial.set_user_attr("surplus", True)
                console.print(
                    f"trial {trial.number} not run: the other workers reached {trials} trials (marked FAIL, surplus)"
                )
                tell(study, trial, None, TrialState.FAIL)
                break
            reseed_for_trial(study, plan.tune, plan.base.seed, trial.number)
            trial.set_user_attr("host", host)
            trial.set_user_attr("pid", pid)
            ran += 1
            state, value = TrialState.FAIL, None
            try:
                value = evaluate(plan, trial, store, console, progress)
                state = TrialState.COMPLETE
            except optuna.TrialPruned:
                state = TrialState.PRUNED
            except KeyboardInterrupt:
                tell(study, trial, None, TrialState.FAIL)
                raise
            except Exception as e:  # noqa: BLE001 - one bad trial must not end the study; FAIL does not count
                console.print(f"[red]trial {trial.number} failed[/] ({type(e).__name__}: {e})")
        if not tell(study, trial, value, state):
            break
    return ran
