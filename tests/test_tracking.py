"""Tracker against a real (temporary) MLflow sqlite store, read back with MlflowClient."""

import json
import math
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from workbench import tracking  # noqa: E402
from workbench.tracking import PARENT_RUN_TAG, TRUNCATION_MARKER, Tracker  # noqa: E402

EXP = "test-workbench"

# MLflow's own sqlalchemy store triggers this deprecation; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy:DeprecationWarning")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module: creating it runs MLflow's migrations (seconds)."""
    tracking._quiet_mlflow()
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    art = str(root / "artifacts")
    return {"uri": uri, "art": art, "client": MlflowClient(tracking_uri=uri), "root": root}


def _tracker(store, **kw):
    return Tracker(store["uri"], EXP, artifact_location=store["art"], **kw)


def test_limits_match_mlflow():
    from mlflow.utils import validation as v

    assert tracking.MAX_PARAMS_PER_BATCH <= v.MAX_PARAMS_TAGS_PER_BATCH
    assert tracking.MAX_METRICS_PER_BATCH <= v.MAX_METRICS_PER_BATCH
    assert tracking.MAX_PARAM_VAL_LENGTH <= v.MAX_PARAM_VAL_LENGTH


def test_params_metrics_artifacts_roundtrip(store, tmp_path):
    client = store["client"]
    local = tmp_path / "spec.yaml"
    local.write_text("drafter:\n  k: 3\n")
    long_value = "x" * 10_000
    many = {f"sweep.p{i:03d}": i for i in range(250)}  # > 100: needs several log_batch calls
    with _tracker(store, run_name="roundtrip", tags={"task": "arith_chain"}) as tr:
        run_id = tr.run_id
        tr.log_params(
            {"drafter": {"kind": "ngram", "k": 3}, "grpo.beta": 0.0, "note": None, "long": long_value, **many}
        )
        tr.log_metrics(
            {"timing_s/gen": 1.5, "spec/acceptance_length": 2.25, "skip_none": None, "skip_nan": math.nan}, step=0
        )
        tr.log_metrics({"timing_s/gen": 1.25, "reward/mean": 0.5}, step=1)
        tr.log_text("hello", "notes/readme.txt")
        tr.log_dict({"a": [1, 2]}, "config/resolved.json")
        tr.log_artifact(local, "spec")
        tr.log_samples([{"prompt": "1+1=", "completion": "2", "reward": 1.0}], step=7)

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "roundtrip" and run.data.tags["task"] == "arith_chain"
    params = run.data.params
    assert params["drafter.kind"] == "ngram" and params["drafter.k"] == "3" and params["grpo.beta"] == "0.0"
    assert params["note"] == "None"
    assert len(params["long"]) == tracking.MAX_PARAM_VAL_LENGTH and params["long"].endswith(TRUNCATION_MARKER)
    assert all(params[k] == str(v) for k, v in many.items())
    assert run.data.metrics["spec/acceptance_length"] == 2.25
    assert "skip_none" not in run.data.metrics and "skip_nan" not in run.data.metrics
    hist = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "timing_s/gen"))
    assert hist == [(0, 1.5), (1, 1.25)]

    dst = tmp_path / "dl"
    dst.mkdir()
    path = client.download_artifacts(run_id, "", str(dst))
    p = Path(path)
    assert (p / "notes/readme.txt").read_text() == "hello"
    assert json.loads((p / "config/resolved.json").read_text()) == {"a": [1, 2]}
    assert (p / "spec/spec.yaml").read_text() == "drafter:\n  k: 3\n"
    samples = json.loads((p / "samples/step_00007.json").read_text())
    assert samples == [{"prompt": "1+1=", "completion": "2", "reward": 1.0}]


def test_exception_marks_failed_and_keeps_metrics(store):
    client = store["client"]
    with pytest.raises(ZeroDivisionError):
        with _tracker(store, run_name="fails") as tr:
            run_id = tr.run_id
            tr.log_metrics({"loss": 0.5}, step=0)
            1 / 0
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.metrics["loss"] == 0.5


def test_keyboard_interrupt_marks_killed(store):
    with pytest.raises(KeyboardInterrupt):
        with _tracker(store, run_name="interrupted") as tr:
            run_id = tr.run_id
            tr.log_metrics({"loss": 1.0}, step=3)
            raise KeyboardInterrupt
    run = store["client"].get_run(run_id)
    assert run.info.status == "KILLED" and run.data.metrics["loss"] == 1.0


def test_parent_and_child_runs_open_together(store):
    with _tracker(store, run_name="sweep") as parent:
        with _tracker(store, run_name="trial-0", parent_run_id=parent.run_id) as child:
            child.log_metrics({"speedup": 1.7}, step=0)
            parent.log_metrics({"best": 1.7}, step=0)
    client = store["client"]
    c, p = client.get_run(child.run_id), client.get_run(parent.run_id)
    assert c.data.tags[PARENT_RUN_TAG] == parent.run_id
    assert c.data.metrics == {"speedup": 1.7} and p.data.metrics == {"best": 1.7}
    assert c.info.status == p.info.status == "FINISHED"


def test_logging_outside_run_raises(store):
    tr = _tracker(store)
    with pytest.raises(RuntimeError):
        tr.log_metrics({"a": 1.0}, step=0)
    with tr:
        pass
    with pytest.raises(RuntimeError):  # ended
        tr.log_metrics({"a": 1.0}, step=0)


def test_bad_metric_value(store):
    with _tracker(store) as tr:
        with pytest.raises(TypeError, match="'acc'"):
            tr.log_metrics({"acc": "high"}, step=0)


def test_disabled_is_noop(tmp_path):
    uri = f"sqlite:///{tmp_path}/never.db"
    with Tracker(uri, EXP, enabled=False) as tr:
        tr.log_params({"a": 1})
        tr.log_metrics({"b": 2.0}, step=0)
        tr.log_text("x", "x.txt")
        tr.log_dict({"x": 1}, "x.json")
        tr.log_artifact(tmp_path / "missing.txt")
        tr.log_samples([{"prompt": "p"}], step=0)
        assert tr.run_id is None
    assert tr.tracking_uri == uri
    assert not (tmp_path / "never.db").exists()


def test_tracking_uri_resolution(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert Tracker(None, EXP, enabled=False).tracking_uri == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://localhost:5000")
    assert Tracker(None, EXP, enabled=False).tracking_uri == "http://localhost:5000"
    assert Tracker("sqlite:///other.db", EXP, enabled=False).tracking_uri == "sqlite:///other.db"


@pytest.mark.slow
def test_sigterm_to_wb_run_marks_the_run_killed_and_keeps_its_metrics(tmp_path):
    """`kill` / `timeout` / a scheduler's preemption send SIGTERM: the open MLflow run ends KILLED, not RUNNING."""
    import os
    import shutil
    import signal
    import sqlite3
    import subprocess
    import time

    wb = shutil.which("wb")
    if wb is None:
        pytest.skip("the wb entry point is not installed (pip install -e .)")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen(
        [
            wb,
            "run",
            "micro",
            "grpo.steps=500",
            "grpo.eval_every=0",
            "measure.modeled=false",
            "tracking.run_name=to-be-killed",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_id = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and run_id is None:
            time.sleep(2)
            try:  # read the store with sqlite alone: a second MLflow client would race wb's schema migration
                with sqlite3.connect(tmp_path / "mlflow.db") as db:
                    row = db.execute("SELECT run_uuid FROM metrics WHERE key = 'reward/mean' LIMIT 1").fetchone()
                run_id = row[0] if row else None
            except sqlite3.OperationalError:  # no store or no tables yet
                pass
        assert run_id is not None, "the run logged no step in time"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    got = MlflowClient(tracking_uri=uri).get_run(run_id)
    assert got.info.status == "KILLED", err[-2000:]
    assert "reward/mean" in got.data.metrics


def test_a_store_whose_database_driver_is_missing_names_the_extra(monkeypatch):
    """postgresql:// without psycopg installed: one line naming the module and the postgres extra."""
    import builtins
    import sys

    from workbench.tracking import StoreError, check_store

    real = builtins.__import__

    def no_psycopg(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and name.split(".")[0] in ("psycopg", "psycopg2"):  # not sqlalchemy's own .psycopg module
            raise ModuleNotFoundError(f"No module named {name!r}", name=name.split(".")[0])
        return real(name, globals, locals, fromlist, level)

    for mod in [m for m in sys.modules if m.split(".")[0] in ("psycopg", "psycopg2")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setattr(builtins, "__import__", no_psycopg)
    with pytest.raises(StoreError, match=r"needs the Python module psycopg.*\[postgres\]"):
        check_store("postgresql://wb@127.0.0.1:1/none", "workbench-micro")
