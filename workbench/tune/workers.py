"""Several `wb tune` workers on one Optuna study: storage, heartbeats and trial accounting.

The rules (``--trials`` is a total over all workers, surplus trials, stale trials of killed
workers) are in `workbench.tune`'s docstring; these helpers only read and write the study.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from typing import Iterator

import optuna
from optuna.trial import TrialState
from rich.console import Console

COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)
ACTIVE = (*COUNTED, TrialState.RUNNING, TrialState.WAITING)  # what a worker counts before asking
# Optuna heartbeats: a live worker refreshes its trial every HEARTBEAT_INTERVAL_S; a trial silent
# for GRACE_PERIOD_S (its worker was killed) is failed. The grace is generous because a heartbeat
# on a loaded 2-core machine or a busy sqlite file can be late by tens of seconds.
HEARTBEAT_INTERVAL_S = 10
GRACE_PERIOD_S = 60
SQLITE_TIMEOUT_S = 60  # several workers writing one sqlite file wait for its lock instead of failing
POLL_S = 2.0  # how often a finished worker looks for trials still running elsewhere


@contextmanager
def optuna_quiet() -> Iterator[None]:
    """Heartbeats and fail_stale_trials are marked experimental, and Study.ask warns that heartbeats
    are meant for Study.optimize: `wb tune`'s ask/tell loop runs Optuna's own heartbeat thread."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.filterwarnings("ignore", message="Heartbeat of storage")
        yield


def make_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage with Optuna heartbeats (stale trials of killed workers become FAIL); sqlite
    connections wait ``SQLITE_TIMEOUT_S`` for the file lock (several writers)."""
    import sqlalchemy.exc

    kwargs = {"connect_args": {"timeout": SQLITE_TIMEOUT_S}} if url.startswith("sqlite") else None
    for attempt in range(3):
        try:
            with optuna_quiet():
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=GRACE_PERIOD_S
                )
        except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.IntegrityError) as e:
            # Workers started together on a new storage race to create its tables and schema
            # version row: sqlite says "table studies already exists" (OperationalError) or "UNIQUE
            # constraint failed: alembic_version", PostgreSQL 'relation "alembic_version" already
            # exists' (ProgrammingError, DuplicateTable); the loser finds them made on the next try.
            if attempt == 2 or not ("already exists" in str(e) or isinstance(e, sqlalchemy.exc.IntegrityError)):
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def fail_stale(study: optuna.Study) -> None:
    """Fail RUNNING trials whose worker stopped sending heartbeats (Optuna's own mechanism)."""
    with optuna_quiet():
        optuna.storages.fail_stale_trials(study)


def counted_trials(study: optuna.Study) -> int:
    """COMPLETE+PRUNED trials (surplus trials are FAIL, so never among them)."""
    return len(study.get_trials(deepcopy=False, states=COUNTED))


def active_trials(study: optuna.Study) -> int:
    """COMPLETE+PRUNED+RUNNING+WAITING trials: those that count, or will, toward ``--trials``."""
    return len(study.get_trials(deepcopy=False, states=ACTIVE))


def trials_before(study: optuna.Study, number: int) -> int:
    """Non-FAIL trials numbered below ``number``. Numbers are assigned atomically by the storage,
    so every worker agrees which of two racing trials came first."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.number < number and t.state != TrialState.FAIL)


def wait_for_others(study: optuna.Study, console: Console, poll_s: float | None = None) -> None:
    """Return once no trial of the study is RUNNING (stale ones are failed on the way)."""
    told = False
    while True:
        fail_stale(study)
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running:
            return
        if not told:
            console.print(f"waiting for {len(running)} trials running in other workers")
            told = True
        time.sleep(POLL_S if poll_s is None else poll_s)


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Optuna's heartbeat thread for one trial, as Study.optimize runs it (ask/tell has no public
    one; the helper is private, so it is imported here only)."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    with get_heartbeat_thread(trial._trial_id, study._storage):
        yield


def tell(study: optuna.Study, trial: optuna.Trial, value: float | None, state: TrialState) -> bool:
    """``study.tell``; False when the sampler asked to stop (GridSampler: every grid point taken;
    Study.stop raises outside Study.optimize, after the trial's state is stored). A trial already
    finished (failed as stale by another worker after a very late heartbeat) is left as it is."""
    try:
        study.tell(trial, value, state=state, skip_if_finished=True)
    except RuntimeError as e:
        if "Study.stop" not in str(e):
            raise
        return False
    return True
