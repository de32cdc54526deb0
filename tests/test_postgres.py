"""MLflow's tracking store and Optuna's storage on a real PostgreSQL server (tests/postgres_server.py: the one
`.ci/run` starts, else one started here): two `wb sweep` workers run each point once and print the same table;
two `wb tune` workers run exactly the trials asked for; the server restarted mid-sweep loses nothing finished
and the sweep resumes."""

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests import postgres_server as pg
from tests.extras import marks
from tests.processes import finish, start_wb
from workbench.tags import TAG_POINT

ROOT = Path(__file__).resolve().parents[1]
pytestmark = marks("postgres", "psycopg")
MICRO = yaml.safe_load((ROOT / "experiments" / "micro.yaml").read_text())


@pytest.fixture(scope="module")
def server():
    """(URI of the server's ``postgres`` database, its folder for pg_ctl)."""
    if os.environ.get("WB_TEST_POSTGRES_URI"):
        yield os.environ["WB_TEST_POSTGRES_URI"], Path(os.environ["WB_TEST_POSTGRES_DATA"])
        return
    if pg.bin_dir() is None:
        pytest.skip("needs a PostgreSQL server: apt-get install postgresql (or set WB_TEST_POSTGRES_URI)")
    folder = Path(tempfile.mkdtemp(prefix="wb-pg-"))  # not under pytest's root-only tmp: the server's user reads it
    uri = pg.start(folder)
    try:
        yield uri, folder
    finally:
        pg.stop(folder)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture()
def db(server, request):
    """A fresh database for one test."""
    name = re.sub(r"\W", "_", request.node.name)[:60].lower()
    return pg.create_database(server[0], name)


def wb(tmp: Path, args: list[str], store: str, log: str):
    return start_wb(tmp, args, log, {"MLFLOW_TRACKING_URI": store})


def point_runs(store: str, name: str):
    from mlflow import MlflowClient

    client = MlflowClient(store)
    exp = client.get_experiment_by_name("workbench-micro")
    runs = client.search_runs([exp.experiment_id], f"tags.`workbench.sweep` = '{name}'") if exp else []
    return [r for r in runs if r.data.tags.get("workbench.sweep.role") == "point"]


def table(text: str, name: str) -> list[str]:
    """The results table a worker printed (read back from the store), from its title to the parent line, less
    the status column's who-ran-it (``ok`` here, ``other worker`` or ``skipped`` there)."""
    block = text[text.index(f"sweep {name} (") : text.index("MLflow parent run")]
    return [re.sub(r"\s+(ok|other worker|skipped)\s*$", "", line).rstrip() for line in block.splitlines()]


SWEEP = ["sweep", "micro", "grpo.eval_every=0", "--quiet"]


@pytest.mark.slow  # two wb sweep processes
def test_two_sweep_workers_on_postgres_run_each_point_once(db, tmp_path):
    procs = [wb(tmp_path, [*SWEEP, "k=1,2", "grpo.steps=3", "--name", "shared"], db, f"w{i}.log") for i in range(2)]
    outs = [finish(p, tmp_path, f"w{i}.log") for i, p in enumerate(procs)]
    runs = point_runs(db, "shared")
    finished = [r.data.tags[TAG_POINT] for r in runs if r.info.status == "FINISHED"]
    assert len(finished) == 3 and len(set(finished)) == 3, [r.info for r in runs]  # baseline, k=1, k=2: once each
    assert table(outs[0], "shared") == table(outs[1], "shared")  # the same table, read back from PostgreSQL
    assert "sweep shared (FINISHED)" in outs[0]


@pytest.mark.slow  # two wb tune processes
def test_two_tune_workers_on_postgres_run_exactly_the_trials_asked(db, tmp_path, server):
    import optuna

    storage = pg.create_database(server[0], "optuna_" + db.rsplit("/", 1)[1][-40:])
    raw = {
        **MICRO,
        "grpo": {**MICRO["grpo"], "eval_every": 0},
        "tune": {"params": {"drafter.k": {"type": "int", "low": 1, "high": 3}}, "storage": storage},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    args = ["tune", "s.yaml", "--trials", "4", "--study", "pg", "--quiet"]
    procs = [wb(tmp_path, args, db, f"t{i}.log") for i in range(2)]
    outs = [finish(p, tmp_path, f"t{i}.log") for i, p in enumerate(procs)]
    study = optuna.load_study(study_name="pg", storage=storage)
    done = [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(done) == 4, [(t.number, t.state.name) for t in study.trials]
    assert all(t.state.name == "FAIL" and t.user_attrs.get("surplus") for t in study.trials if t not in done)
    assert len({t.user_attrs["pid"] for t in done}) == 2, "one worker ran every trial"
    from mlflow import MlflowClient

    exp = MlflowClient(db).get_experiment_by_name("workbench-micro")
    trials = MlflowClient(db).search_runs([exp.experiment_id], "tags.`workbench.study` = 'pg'")
    assert sum(r.data.tags.get("workbench.tune.role") == "trial" and r.info.status == "FINISHED" for r in trials) == 4
    assert all("study pg" in out for out in outs)


@pytest.mark.slow  # a sweep, a server restart, the sweep again
def test_server_restart_mid_sweep_loses_nothing_finished(db, tmp_path, server):
    args = [*SWEEP, "k=1,2,3", "grpo.steps=4", "--name", "restart"]
    proc, end = wb(tmp_path, args, db, "first.log"), time.time() + 240
    while not any(r.info.status == "FINISHED" for r in point_runs(db, "restart")):
        assert time.time() < end and proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        time.sleep(0.5)
    before = {r.info.run_id for r in point_runs(db, "restart") if r.info.status == "FINISHED"}
    pg.pg_ctl(server[1], "-w", "-m", "fast", "restart")  # every connection dropped
    pg.wait_ready(server[0])
    first = finish(proc, tmp_path, "first.log", ok=False)  # finishes, or fails a point the restart hit
    again = finish(wb(tmp_path, [*args, "--claim-timeout", "10"], db, "again.log"), tmp_path, "again.log")
    runs = point_runs(db, "restart")
    finished = {r.info.run_id for r in runs if r.info.status == "FINISHED"}
    assert before <= finished, "a point finished before the restart was lost"
    points = [r.data.tags[TAG_POINT] for r in runs if r.info.status == "FINISHED"]
    assert len(points) == 4 and len(set(points)) == 4, (first[-2000:], again[-2000:])
    assert "sweep restart (FINISHED)" in again
