"""Several `wb sweep --name X` workers on one MLflow store (issue #10 part 3): the claim rule on a fake
store and a real sqlite store, then real `wb sweep` processes: two started together run each point
once; one killed mid-point leaves its point to the other."""

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from mlflow import MlflowClient

from workbench.specs import load_spec
from workbench.sweep.claims import ClaimLost, Heartbeat, claim_point, point_state
from workbench.sweep.store import SweepStore
from workbench.tags import TAG_HEARTBEAT, TAG_POINT, TAG_STALE, TAG_WORKER
from workbench.tracking import store_open_lock

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_000_000.0  # the fake clock's "now", unix seconds


@dataclass
class FakeRun:
    run_id: str
    status: str
    start_time: int  # ms
    tags: dict = field(default_factory=dict)


class FakeStore:
    """The four store calls claim_point makes, over a list of runs; ``during_settle`` runs while it waits."""

    def __init__(self, *runs, during_settle=None):
        self.runs, self.during_settle, self.failed, self.dropped = list(runs), during_settle, [], []

    def point_runs(self, key):
        return [r for r in self.runs if r.tags.get(TAG_POINT) == key]

    def create_claim(self, run_name, tags):
        self.runs.append(FakeRun("mine", "RUNNING", int(T0 * 1000), dict(tags)))
        return "mine"

    def fail(self, run_id, why):
        r = next(r for r in self.runs if r.run_id == run_id)
        r.status, r.tags[TAG_STALE] = "FAILED", why
        self.failed.append(run_id)

    def drop(self, run_id):
        self.runs = [r for r in self.runs if r.run_id != run_id]
        self.dropped.append(run_id)

    def sleep(self, s):
        if self.during_settle:
            self.during_settle(self)


def foreign(run_id="theirs", status="RUNNING", start=T0 - 30, beat=T0 - 5, **tags):
    t = {TAG_POINT: "p", TAG_WORKER: "other:1:x", **tags}
    if beat is not None:
        t[TAG_HEARTBEAT] = f"{beat:.3f}"
    return FakeRun(run_id, status, int(start * 1000), t)


def claim(store, since=T0 - 100, timeout=60.0):
    return claim_point(
        store,
        "p",
        "run",
        {TAG_POINT: "p"},
        "me:2:y",
        int(since * 1000),
        timeout,
        2.0,
        clock=lambda: T0,
        sleep=store.sleep,
    )


# ----------------------------------------------------------------------------- the rule (fake store and clock)


def test_open_point_is_claimed_and_the_claim_carries_worker_and_heartbeat():
    store = FakeStore()
    st = claim(store)
    assert st.kind == "claimed" and st.run.run_id == "mine" and not store.dropped
    assert st.run.tags[TAG_WORKER] == "me:2:y" and float(st.run.tags[TAG_HEARTBEAT]) == T0


@pytest.mark.parametrize("their_start,i_win", [(T0 - 0.5, False), (T0 + 0.5, True), (T0, False)])
def test_earliest_claim_made_at_the_same_moment_wins(their_start, i_win):
    """Another worker claims while this one settles: the earliest (start_time, run_id) wins, both read
    the same order ("mine" > "a-claim" on a tie), the loser drops its claim and moves on."""
    store = FakeStore(during_settle=lambda s: s.runs.append(foreign("a-claim", start=their_start, beat=their_start)))
    st = claim(store)
    if i_win:
        assert st.kind == "claimed" and st.run.run_id == "mine" and not store.dropped
    else:
        assert st.kind == "busy" and st.run.run_id == "a-claim" and store.dropped == ["mine"]


def test_fresh_foreign_claim_is_skipped_without_claiming():
    store = FakeStore(foreign(beat=T0 - 59))
    st = claim(store)
    assert st.kind == "busy" and st.run.run_id == "theirs"
    assert [r.run_id for r in store.runs] == ["theirs"] and not store.failed  # nothing created, nothing failed


@pytest.mark.parametrize("beat", [T0 - 61, None])  # heartbeat too old; none (an older workbench) and started 61 s ago
def test_stale_claim_is_failed_and_the_point_taken_over(beat):
    store = FakeStore(foreign(beat=beat, start=T0 - 61))
    st = claim(store)
    assert st.kind == "claimed" and store.failed == ["theirs"] and [r.run_id for r in st.stale] == ["theirs"]
    dead = store.runs[0]
    assert dead.status == "FAILED" and "timeout 60 s" in dead.tags[TAG_STALE] and "other:1:x" in dead.tags[TAG_STALE]


def _gone_pid() -> int:
    """The id of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


def test_a_dead_local_claim_is_released_at_once():
    """``kill -9`` of a worker: its claim names this host and a process that no longer exists, so a re-run
    takes the point over at once, its heartbeat seconds old; a live local process or another host's
    claim is waited for."""
    import socket

    from workbench.tags import TAG_HOST

    host, gone = socket.gethostname(), _gone_pid()
    store = FakeStore(foreign(beat=T0 - 1, **{TAG_WORKER: f"{host}:{gone}:ab", TAG_HOST: host}))
    st = claim(store)
    assert st.kind == "claimed" and store.failed == ["theirs"]
    assert f"its process {gone} on this host is gone" in store.runs[0].tags[TAG_STALE]
    for worker, tag_host in ((f"{host}:{os.getpid()}:ab", host), (f"elsewhere:{gone}:ab", "elsewhere")):
        st = claim(FakeStore(foreign(beat=T0 - 1, **{TAG_WORKER: worker, TAG_HOST: tag_host})))
        assert st.kind == "busy", worker


@pytest.mark.parametrize(
    "run,kind",
    [
        (foreign(status="FINISHED"), "done"),
        (foreign(status="FAILED", start=T0 - 10), "failed"),  # failed since this worker started: not retried by it
        (foreign(status="FAILED", start=T0 - 200), "claimed"),  # failed before it started: a resume retries it
        (foreign(status="FAILED", start=T0 - 10, **{TAG_STALE: "dead"}), "claimed"),  # a dead worker's: retried
        (foreign(status="KILLED", start=T0 - 10), "claimed"),  # Ctrl-C in another worker: retried
    ],
)
def test_finished_failed_and_killed_points(run, kind):
    assert claim(FakeStore(run)).kind == kind


def test_finished_wins_over_a_live_claim():
    runs = [foreign("old", status="FINISHED", start=T0 - 500), foreign("late")]
    assert point_state(runs, T0, 60, 0).kind == "done"


# ----------------------------------------------------------------------------- a real sqlite MLflow store


@pytest.fixture()
def spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return load_spec("micro")


def test_parents_created_together_become_one_and_claims_race_to_one_winner(spec):
    """Two workers (threads, two stores) both miss the parent and create one; then both claim one point."""
    stores = [SweepStore.open(spec, "race") for _ in range(2)]
    for s in stores:
        s.settle_s = 1.0
        s.reader.find_parent = lambda *a, **k: None  # both miss the other's parent: the race
    barrier, states = threading.Barrier(2), [None, None]

    def worker(i):
        barrier.wait()
        stores[i].open_parent({"workbench.spec": "micro"})
        barrier.wait()
        states[i] = claim_point(stores[i], "p", "run", {TAG_POINT: "p"}, f"w{i}", 0, 60.0, 1.0)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    assert stores[0].parent_id == stores[1].parent_id and stores[1].resumed != stores[0].resumed
    client = stores[0].client
    parents = client.search_runs([stores[0].experiment_id], "tags.`workbench.sweep.role` = 'parent'")
    assert [p.info.run_id for p in parents] == [stores[0].parent_id]  # the loser's parent is deleted
    assert sorted(s.kind for s in states) == ["busy", "claimed"]
    won = next(s.run.run_id for s in states if s.kind == "claimed")
    assert next(s.run.run_id for s in states if s.kind == "busy") == won  # the loser names the winner
    assert [r.run_id for r in stores[0].point_runs("p")] == [won]  # the losing claim is gone


def test_heartbeat_refreshes_and_a_claim_failed_as_stale_is_lost(spec):
    store = SweepStore.open(spec, "beat")
    store.settle_s = 0.0
    store.open_parent({})
    run_id = claim_point(store, "p", "run", {TAG_POINT: "p"}, "w", 0, 60.0, 0.0).run.run_id
    first = float(store.client.get_run(run_id).data.tags[TAG_HEARTBEAT])
    with Heartbeat(store.client, run_id, 0.2) as beat:
        time.sleep(0.7)
        assert float(store.client.get_run(run_id).data.tags[TAG_HEARTBEAT]) > first
        beat.check(1, {})  # still ours: no exception
        store.fail(run_id, "taken over in a test")
        time.sleep(0.7)
        with pytest.raises(ClaimLost):
            beat.check(2, {})


# ----------------------------------------------------------------------------- real `wb sweep` processes


SWEEP = ["sweep", "micro", "k=1,2", "grpo.eval_every=0", "grpo.steps=3", "--quiet"]


def start_worker(tmp_path: Path, name: str, log: str, claim_timeout: float) -> subprocess.Popen:
    """`python -m workbench.cli sweep ...` in tmp_path on its sqlite store, one thread (2-core CI)."""
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with open(tmp_path / log, "w") as out:  # the child keeps its own copy of the file
        return subprocess.Popen(
            [sys.executable, "-m", "workbench.cli", *SWEEP, "--name", name, "--claim-timeout", str(claim_timeout)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def children(client: MlflowClient, name: str):
    exp = client.get_experiment_by_name("workbench-micro")
    runs = client.search_runs([exp.experiment_id], f"tags.`workbench.sweep` = '{name}'") if exp else []
    return [r for r in runs if r.data.tags.get("workbench.sweep.role") == "point"], [
        r for r in runs if r.data.tags.get("workbench.sweep.role") == "parent"
    ]


def check_each_point_finished_once(client, name):
    """One FINISHED parent; each of the 3 points FINISHED exactly once; any other claim left is a FAILED
    one taken over as stale (a worker killed, or one whose heartbeat a loaded machine delayed past the
    timeout: its run then stops at its next step, as seen once on the shared 2-core VM)."""
    points, parents = children(client, name)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    finished = [r.data.tags[TAG_POINT] for r in points if r.info.status == "FINISHED"]
    assert len(finished) == 3 and len(set(finished)) == 3, finished  # baseline + k=1 + k=2, each exactly once
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in points)
    others = [r for r in points if r.info.status != "FINISHED"]
    assert all(r.info.status == "FAILED" and TAG_STALE in r.data.tags for r in others), [r.info for r in others]
    return points


def wait(proc: subprocess.Popen, tmp_path: Path, log: str, timeout: float = 240) -> str:
    try:
        proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = (tmp_path / log).read_text()
    # the workbench frames of a traceback come first, MLflow's and sqlalchemy's last: show both ends
    assert proc.returncode == 0, (text[:2500] + "\n[...]\n" + text[-2500:]) if len(text) > 5000 else text
    return text


@pytest.mark.slow  # two wb sweep processes
def test_two_workers_started_together_run_each_point_once(tmp_path):
    procs = [start_worker(tmp_path, "shared", f"w{i}.log", claim_timeout=30) for i in range(2)]
    outs = [wait(p, tmp_path, f"w{i}.log") for i, p in enumerate(procs)]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    points = check_each_point_finished_once(client, "shared")  # no killed or deleted (lost) claim left behind
    for out in outs:  # both print the table, read back from the store once no point is claimed
        assert "sweep shared (FINISHED)" in out
    workers = {r.data.tags[TAG_WORKER] for r in points}
    print("points per worker:", {w: sum(r.data.tags[TAG_WORKER] == w for r in points) for w in workers})


@pytest.mark.slow  # two wb sweep processes, one killed
def test_worker_killed_mid_point_leaves_it_to_the_other(tmp_path):
    """Two workers; the owner of the first point seen mid-run (params logged, RUNNING) is SIGKILLed; its
    claim (its process gone from this host, or its heartbeat stale after --claim-timeout, 12 s) is taken
    over and the survivor runs the point."""
    procs = {p.pid: p for p in (start_worker(tmp_path, "kill", f"w{i}.log", claim_timeout=12) for i in range(2))}
    logs = {pid: f"w{i}.log" for i, pid in enumerate(procs)}
    client, victim, deadline = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db"), None, time.time() + 180
    while victim is None and time.time() < deadline:
        try:
            with store_open_lock(f"sqlite:///{tmp_path}/mlflow.db"):  # never migrate the new store beside a worker
                points, _ = children(client, "kill")
        except Exception:  # noqa: BLE001 - the experiment is being created
            points = []
        for r in points:
            pid = int(r.data.tags[TAG_WORKER].split(":")[1])
            if r.info.status == "RUNNING" and "drafter.kind" in r.data.params and pid in procs:
                victim, killed_run = pid, r.info.run_id
                os.kill(pid, signal.SIGKILL)
                break
        time.sleep(0.1)
    assert victim is not None, "no point seen mid-run"
    procs[victim].wait(10)
    survivor = next(pid for pid in procs if pid != victim)
    out = wait(procs[survivor], tmp_path, logs[survivor])
    # one host: the dead process is seen at once (before that, its heartbeat going stale)
    assert "took over: " in out and "sweep kill (FINISHED)" in out
    points = check_each_point_finished_once(client, "kill")
    dead = next(r for r in points if r.info.run_id == killed_run)
    why = dead.data.tags[TAG_STALE]
    assert dead.info.status == "FAILED" and ("is gone" in why or "no heartbeat" in why), why


def test_a_tag_written_by_two_workers_at_once_is_retried():
    """MLflow's set-tag is select-then-insert: the second of two workers inserting one tag gets an
    integrity error (seen with two workers on an `mlflow server`); the write is tried again."""
    from mlflow.exceptions import MlflowException

    from workbench.sweep.store import retried

    calls = []

    def set_tag(*args):
        calls.append(args)
        if len(calls) == 1:
            raise MlflowException("(sqlite3.IntegrityError) UNIQUE constraint failed: tags.key, tags.run_uuid")

    retried(set_tag, "run", "k", "v")
    assert len(calls) == 2
    with pytest.raises(MlflowException, match="no such run"):
        retried(lambda: (_ for _ in ()).throw(MlflowException("no such run")))  # other errors are not retried


def test_open_retries_a_schema_migration_race(monkeypatch):
    """A process migrating a new sqlite store outside the lock makes the loser's first open raise
    ("table ... already exists", seen once under a loaded full suite); open waits and tries again,
    and other errors still raise."""
    import workbench.sweep.store as store_mod

    calls = []

    def init(self, spec, name):
        calls.append(name)
        if len(calls) == 1:
            raise RuntimeError("(sqlite3.OperationalError) table sql_trace_metric_daily_rollups already exists")

    monkeypatch.setattr(SweepStore, "__init__", init)
    monkeypatch.setattr(store_mod.time, "sleep", lambda s: None)
    from workbench.specs import load_spec

    spec = load_spec("micro", ["tracking.tracking_uri=sqlite:////tmp/wb-retry-test.db"])
    assert isinstance(SweepStore.open(spec, "s"), SweepStore) and calls == ["s", "s"]
    monkeypatch.setattr(
        SweepStore, "__init__", lambda self, spec, name: (_ for _ in ()).throw(RuntimeError("disk full"))
    )
    with pytest.raises(RuntimeError, match="disk full"):
        SweepStore.open(spec, "s")
