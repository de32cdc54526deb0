"""The MLflow tags the workbench writes (tracking, sweep, tune) and reads (runs, report, ui): one schema.

Sweeps: a parent run tagged ``workbench.sweep`` = name and role ``parent``; one child per point (role
``point``) with the hash of its resolved spec and one ``workbench.axis.<key>`` tag per axis; the worker
that claimed it and its heartbeat (`workbench.sweep.claims`). Studies:
a parent tagged ``workbench.study``; one child per trial. Children carry MLflow's own
``mlflow.parentRunId``, which the MLflow UI uses to nest them.
"""

PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's: nests child runs in the UI

TAG_SWEEP = "workbench.sweep"  # sweep name, on the parent and every child
TAG_ROLE = "workbench.sweep.role"  # "parent" | "point"
TAG_POINT = "workbench.sweep.point"  # hash of the point's resolved spec (children)
TAG_AXIS = "workbench.axis."  # + dotted key: the point's value (children) / all values (parent)
TAG_WORKER = "workbench.sweep.worker"  # host:pid:id of the `wb sweep` process that claimed the point
TAG_HEARTBEAT = "workbench.sweep.heartbeat"  # unix seconds, refreshed while the point runs
TAG_STALE = "workbench.sweep.stale"  # why a claim was failed as its worker's (heartbeat too old)
TAG_ERROR = "workbench.sweep.error"  # what a failed point raised (read by the other workers)
TAG_RUN_ERROR = "workbench.error"  # what a FAILED `wb run` raised ("Type: message"), e.g. a task.reward function

TAG_STUDY = "workbench.study"  # Optuna study name, on the parent and every trial
TAG_TUNE_ROLE = "workbench.tune.role"  # "parent" | "trial" | "duplicate"
TAG_TRIAL = "workbench.tune.trial"  # Optuna trial number
TAG_HOST = "workbench.host"  # the machine that ran the trial
TAG_MACHINE = "workbench.machine"  # the CPU model and its instruction sets (AVX-512, AMX), or the GPU: every run
TAG_ENGINE_PATH = "workbench.engine_path"  # the workbench engine's forward: eager / eager, packed weights / compiled
TAG_VERSION = "workbench.version"  # the installed workbench's version: every run (its commit: mlflow.source.git.commit)
TAG_GIT_DIRTY = "workbench.git_dirty"  # "true" when the checkout that ran had uncommitted changes to tracked files
TAG_PARAM = "workbench.param."  # + dotted key: the trial's value
