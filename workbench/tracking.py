"""MLflow tracking for `wb run`: one MLflow run per experiment (docs/design.md §7).

    with Tracker(None, "workbench", run_name="k3-eagle") as tr:
        tr.log_params(spec.flat_params())          # drafter.k = 3, ...
        tr.log_metrics({"timing_s/gen": 1.2}, step=0)

Everything goes through ``mlflow.MlflowClient`` with an explicit run id, never the fluent
``mlflow.start_run`` global state, so several Trackers can be open at once (a sweep's parent run
with child runs, or parallel workers). ``enabled=False`` turns every method into a no-op.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from workbench.specs import flatten
from workbench.tags import PARENT_RUN_TAG

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"  # MLflow's own default store, relative to the cwd

# Limits of MLflow's log_batch / param store (mlflow.utils.validation); fixed numbers so importing
# this module does not import mlflow (it is slow and optional when tracking is disabled).
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VAL_LENGTH = 6000
TRUNCATION_MARKER = "...[truncated]"


def resolve_tracking_uri(tracking_uri: str | None) -> str:
    """Explicit URI, else $MLFLOW_TRACKING_URI, else ``sqlite:///mlflow.db``."""
    return tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _quiet_mlflow() -> None:
    # Store creation logs alembic migrations at INFO on every fresh sqlite file: noise for users.
    for name in ("mlflow.store", "alembic"):
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)


def system_tags(tags: Mapping[str, str]) -> dict[str, str]:
    """``tags`` with MLflow's system tags (``mlflow.user``, ``mlflow.source.name``/``type``, and
    ``mlflow.source.git.commit`` from a checkout), as ``mlflow.start_run`` adds them, ``workbench.version`` and,
    from a checkout, ``workbench.git_dirty`` (whether tracked files differed from that commit).

    ``MlflowClient.create_run`` adds none itself; MLflow's own context registry resolves them (its git
    provider needs GitPython, so the commit falls back to :func:`workbench.version.git_commit`). The
    caller's tags win.
    """
    from mlflow.tracking.context.registry import resolve_tags
    from mlflow.utils.mlflow_tags import MLFLOW_GIT_COMMIT

    from workbench.tags import TAG_GIT_DIRTY, TAG_VERSION
    from workbench.version import git_commit, version

    out = resolve_tags({TAG_VERSION: version()})
    commit = git_commit()
    if commit is not None:
        out.setdefault(MLFLOW_GIT_COMMIT, commit[0])
        out[TAG_GIT_DIRTY] = str(commit[1]).lower()
    out.update(tags)
    return out


def _param_value(value: Any) -> str:
    s = str(value)
    if len(s) > MAX_PARAM_VAL_LENGTH:
        s = s[: MAX_PARAM_VAL_LENGTH - len(TRUNCATION_MARKER)] + TRUNCATION_MARKER
    return s


def _jsonable(obj: Any) -> Any:
    """json.dumps fallback for tensors / numpy values that show up in rollout samples."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    return str(obj)


class StoreError(ValueError):
    """An MLflow store that cannot be opened or read: an unknown URI scheme, a file that is not a database,
    an unreachable server. The message is one line naming the store and the fix."""


def _one_line(e: BaseException) -> str:
    first = str(e).split("[SQL:")[0].strip().splitlines()
    text = " ".join(first[0].split()) if first else ""
    return f"{type(e).__name__}: {text[:240]}" if text else type(e).__name__


def store_open_lock(uri: str) -> Any:
    """A context that serializes the first opening of a database MLflow store: MLflow migrates a new store's
    schema on first use, and two processes doing so at once make the loser raise (alembic's "expected to
    match one row", sqlite's "table ... already exists", PostgreSQL's duplicate ``pg_type`` key).

    sqlite: a file lock (filelock, a dependency of torch) in the temp folder, keyed by the database path
    (sqlite files are shared on one machine only). PostgreSQL: the database's own session-level advisory
    lock (``pg_advisory_lock``), which every machine sharing the server sees. Other stores: no lock.

    Raises:
        filelock.Timeout: the sqlite lock was held for 600 s.
        sqlalchemy.exc.OperationalError: the PostgreSQL server cannot be reached.
    """
    import contextlib
    import hashlib
    import tempfile

    if uri.startswith(("postgresql:", "postgresql+", "postgres:")):
        return _advisory_lock(uri)
    from filelock import FileLock
    from sqlalchemy.engine import make_url

    db = make_url(uri).database if uri.startswith("sqlite:") else None
    if not db or db == ":memory:":
        return contextlib.nullcontext()
    key = hashlib.sha256(os.path.abspath(db).encode()).hexdigest()[:16]
    return FileLock(os.path.join(tempfile.gettempdir(), f"wb-mlflow-{key}.lock"), timeout=600)


SCHEMA_LOCK_KEY = 0x77625F6D6C666C6F  # "wb_mlflo": the advisory lock id that workbench processes agree on


@contextmanager
def _advisory_lock(uri: str) -> Iterator[None]:
    """``pg_advisory_lock(SCHEMA_LOCK_KEY)`` on one connection of its own, held for the block."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(uri, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": SCHEMA_LOCK_KEY})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": SCHEMA_LOCK_KEY})
    finally:
        engine.dispose()


def check_store(tracking_uri: str | None, experiment: str) -> None:
    """Open the store and look ``experiment`` up (a fresh sqlite file gets its tables here), so a store that
    cannot be used fails before any model is built. An http(s) store is asked once, without MLflow's retries.

    Raises:
        StoreError: the store cannot be used.
    """
    from mlflow import MlflowClient

    _quiet_mlflow()
    uri = resolve_tracking_uri(tracking_uri)
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}
    unset = [k for k in quick if k not in os.environ]
    os.environ.update({k: quick[k] for k in unset})
    try:
        with store_open_lock(uri):
            MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
    except ModuleNotFoundError as e:  # the database's driver: SQLAlchemy imports it on first use
        raise StoreError(
            f"MLflow store {uri} needs the Python module {e.name}: pip install 'speculation-workbench[postgres]' "
            f"(psycopg, for postgresql://) or the driver of that database"
        ) from None
    except Exception as e:  # noqa: BLE001 - any failure of the store: sqlalchemy's, MLflow's, the network's
        raise StoreError(
            f"MLflow store {uri} cannot be used ({_one_line(e)}); fix tracking.tracking_uri or MLFLOW_TRACKING_URI "
            "(a sqlite:///FILE.db, a folder, or a running http:// server), or set tracking.enabled=false"
        ) from None
    finally:
        for k in unset:
            os.environ.pop(k, None)


class Tracker:
    """One MLflow run, opened by ``__enter__`` and closed by ``__exit__``.

    Args:
        tracking_uri: MLflow URI; None -> $MLFLOW_TRACKING_URI if set, else ``sqlite:///mlflow.db``.
        experiment: experiment name; created if missing (restored if it was deleted).
        run_name: MLflow run name (None: MLflow picks one).
        enabled: False -> no MLflow at all, every method is a no-op.
        tags: extra run tags (values stringified, None dropped).
        parent_run_id: makes this a child run (``mlflow.parentRunId`` tag), e.g. one trial of a sweep.
        artifact_location: where a *newly created* experiment stores artifacts (None: MLflow default).
        run_id: log into this existing RUNNING run instead of creating one (a sweep point's claim,
            `workbench.sweep.claims`); ``tags`` are added to it, ``run_name`` is ignored.

    Exit status: FINISHED on normal exit, KILLED on KeyboardInterrupt, FAILED on any other
    exception; the exception is re-raised and what was logged before stays.
    """

    def __init__(
        self,
        tracking_uri: str | None,
        experiment: str,
        run_name: str | None = None,
        enabled: bool = True,
        tags: Mapping[str, Any] | None = None,
        parent_run_id: str | None = None,
        artifact_location: str | None = None,
        run_id: str | None = None,
    ):
        self._tracking_uri = resolve_tracking_uri(tracking_uri)
        self.experiment = experiment
        self.run_name = run_name
        self.enabled = enabled
        self.tags = {k: str(v) for k, v in (tags or {}).items() if v is not None}
        if parent_run_id:
            self.tags[PARENT_RUN_TAG] = parent_run_id
        self.artifact_location = artifact_location
        self._attach = run_id
        self._client = None
        self._run_id: str | None = None
        self.experiment_id: str | None = None

    # ------------------------------------------------------------------ properties

    @property
    def run_id(self) -> str | None:
        """The MLflow run id while/after the run is open; None when disabled or not started."""
        return self._run_id

    @property
    def tracking_uri(self) -> str:
        return self._tracking_uri

    @property
    def active(self) -> bool:
        return self.enabled and self._run_id is not None

    # ------------------------------------------------------------------ lifecycle

    def _get_or_create_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        exp = self._client.get_experiment_by_name(self.experiment)
        if exp is None:
            try:
                return self._client.create_experiment(self.experiment, artifact_location=self.artifact_location)
            except MlflowException:
                # Another worker created it between our lookup and create: use theirs.
                exp = self._client.get_experiment_by_name(self.experiment)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            # A deleted experiment keeps its name reserved; bring it back rather than fail.
            self._client.restore_experiment(exp.experiment_id)
        return exp.experiment_id

    def start(self) -> "Tracker":
        """Create the run (``with Tracker(...)`` calls this). No-op when disabled."""
        if not self.enabled:
            return self
        if self._run_id is not None:
            raise RuntimeError(f"Tracker already started (run {self._run_id})")
        from mlflow import MlflowClient

        _quiet_mlflow()  # after the import: importing mlflow configures its loggers

        self._client = MlflowClient(tracking_uri=self._tracking_uri)
        if self._attach:
            from mlflow.entities import RunTag

            self.experiment_id = self._client.get_run(self._attach).info.experiment_id
            self._run_id = self._attach
            if self.tags:
                self._client.log_batch(self._run_id, tags=[RunTag(k, v) for k, v in self.tags.items()])
            return self
        self.experiment_id = self._get_or_create_experiment()
        run = self._client.create_run(self.experiment_id, run_name=self.run_name, tags=system_tags(self.tags))
        self._run_id = run.info.run_id
        return self

    def end(self, status: str = "FINISHED") -> None:
        """Mark the run FINISHED / FAILED / KILLED. Idempotent; no-op when disabled."""
        if not self.active or self._client is None:
            return
        client, self._client = self._client, None
        client.set_terminated(self._run_id, status=status)

    def __enter__(self) -> "Tracker":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            status = "FINISHED"
        elif issubclass(exc_type, KeyboardInterrupt):
            status = "KILLED"
            if self.active and exc is not None:  # the CLI says which run it marked (none: no run was open)
                exc.mlflow_run_id = self._run_id
        else:
            status = "FAILED"
        try:
            self.end(status)
        except Exception:
            if exc_type is None:
                raise
            # Never let a tracking failure hide the exception that ended the run.
            logging.getLogger(__name__).warning("could not mark MLflow run %s %s", self._run_id, status, exc_info=True)
        return False  # re-raise

    def _require(self) -> bool:
        """True if calls should reach MLflow; raises if enabled but not started/already ended."""
        if not self.enabled:
            return False
        if self._client is None:
            raise RuntimeError("Tracker is not running; use `with Tracker(...) as tr:` (or tr.start())")
        return True

    # ------------------------------------------------------------------ logging

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log params as flat dotted keys (nested dicts are flattened), values as strings.

        Values longer than MLflow's limit (6000 chars) are cut to the limit ending in
        ``...[truncated]``. Sent in batches of <= 100 (log_batch limit). MLflow params are
        immutable: re-logging a key with a different value raises MlflowException.
        """
        if not self._require():
            return
        from mlflow.entities import Param

        items = [Param(k, _param_value(v)) for k, v in flatten(dict(params)).items()]
        for i in range(0, len(items), MAX_PARAMS_PER_BATCH):
            self._client.log_batch(self._run_id, params=items[i : i + MAX_PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log scalar metrics at ``step``. None and NaN values are skipped (no crash).

        Values may be floats, ints, bools, 0-d tensors or numpy scalars. Names may contain '/'
        (``timing_s/gen``). Raises TypeError for a non-numeric value, naming its key.
        """
        if not self._require():
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        items = []
        for k, v in metrics.items():
            if v is None:
                continue
            try:
                x = float(v.item() if hasattr(v, "item") else v)
            except (TypeError, ValueError) as e:
                raise TypeError(f"metric {k!r} is not a number: {v!r}") from e
            if math.isnan(x):
                continue
            items.append(Metric(k, x, ts, int(step)))
        for i in range(0, len(items), MAX_METRICS_PER_BATCH):
            self._client.log_batch(self._run_id, metrics=items[i : i + MAX_METRICS_PER_BATCH])

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if not self._require():
            return
        for k, v in tags.items():
            if v is not None:
                self._client.set_tag(self._run_id, k, str(v))

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write ``text`` as the artifact ``artifact_file`` (a run-relative path)."""
        if not self._require():
            return
        self._client.log_text(self._run_id, text, artifact_file)

    def log_dict(self, d: Any, artifact_file: str) -> None:
        """Write a dict/list as a JSON (or .yaml/.yml) artifact; tensors/numpy become lists."""
        if not self._require():
            return
        self._client.log_dict(self._run_id, json.loads(json.dumps(d, default=_jsonable)), artifact_file)

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Copy a local file into the run's artifacts (under ``artifact_path`` if given)."""
        if not self._require():
            return
        self._client.log_artifact(self._run_id, os.fspath(local_path), artifact_path)

    def log_artifacts(self, local_dir: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Copy a local folder's files into the run's artifacts (e.g. a drafter checkpoint)."""
        if not self._require():
            return
        self._client.log_artifacts(self._run_id, os.fspath(local_dir), artifact_path)

    def log_samples(self, rows: list[dict], step: int) -> None:
        """Rollout samples (prompt, completion, reward, ...) as a JSON list in ``samples/step_{step:05d}.json``."""
        if not self._require():
            return
        text = json.dumps(list(rows), default=_jsonable, ensure_ascii=False, indent=1)
        self._client.log_text(self._run_id, text, f"samples/step_{int(step):05d}.json")
