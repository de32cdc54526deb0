"""`wb sweep --ray`: sweep points as Ray tasks. The resource and path rules, then a real two-node Ray
cluster on this machine (a head and a second node started by `ray start` as separate processes, one CPU
each): a micro sweep spreads over both nodes and tabulates as a single-process run does; the second node
killed mid-point (its process group, by pid) has that point rerun on the head, each point FINISHED once."""

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.extras import requires
from tests.processes import finish, start_wb
from workbench.ray_cluster import ClusterError, absolute_store, point_resources, reachable, task_env
from workbench.specs import load_spec
from workbench.sweep import plan_sweep
from workbench.sweep.ray_launch import TAG_NODE, TAG_PID
from workbench.tags import TAG_POINT, TAG_STALE

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- rules (no Ray needed)


@pytest.mark.parametrize(
    "device, cluster_gpus, gpus",
    [("cpu", 0, 0.0), ("cpu", 8, 0.0), ("auto", 0, 0.0), ("auto", 2, 1.0), ("cuda", 1, 1.0), ("cuda:1", 4, 1.0)],
)
def test_point_asks_for_a_gpu_when_its_device_is_cuda(device, cluster_gpus, gpus):
    spec = load_spec("micro", [f"model.device={device}"])
    assert point_resources(spec.model.device, 2.0, cluster_gpus) == {"num_cpus": 2.0, "num_gpus": gpus}


def test_cuda_point_on_a_cluster_without_gpus_is_refused():
    with pytest.raises(ClusterError, match="no GPU"):
        point_resources(load_spec("micro", ["model.device=cuda"]).model.device, 1.0, 0)


def test_relative_sqlite_store_is_made_absolute_for_the_tasks():
    assert absolute_store("sqlite:///mlflow.db", "/work/x") == "sqlite:////work/x/mlflow.db"
    for same in ("sqlite:////abs/m.db", "postgresql://u@h:5432/db", "http://127.0.0.1:5000", "sqlite:///:memory:"):
        assert absolute_store(same, "/work/x") == same


def test_tasks_get_the_workbench_and_hub_environment_only():
    env = {
        "WB_CACHE_DIR": "/c",
        "HF_HUB_OFFLINE": "1",
        "MLFLOW_TRACKING_URI": "x",
        "HOME": "/root",
        "RAY_AUTH_TOKEN": "s",
    }
    assert task_env(env) == {"WB_CACHE_DIR": "/c", "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": "x"}


def test_an_address_where_nothing_listens_is_refused_at_once():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(ClusterError, match="no Ray cluster answers"):
            reachable(f"127.0.0.1:{port}")
    reachable("local")  # left to Ray
    reachable("auto")


# ----------------------------------------------------------------------------- a two-node cluster

RAY_ENV = {
    "RAY_AUTH_MODE": "token",  # Ray 2.59+ clusters started on one machine use token auth: every node and driver
    "RAY_health_check_period_ms": "1000",  # a killed node is declared dead in seconds, not tens of them
    "RAY_health_check_failure_threshold": "3",
    "RAY_USAGE_STATS_ENABLED": "0",
}
NODE = ["--num-cpus", "1", "--object-store-memory", "100000000", "--disable-usage-stats"]


def _ray(*args, env, **kw):
    return subprocess.run([sys.executable, "-m", "ray.scripts.scripts", *args], env=env, timeout=120, **kw)


class Cluster:
    def __init__(self, tmp: Path):
        self.env = {
            **os.environ,
            **RAY_ENV,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            # token auth needs a token on every node and driver: this cluster's own, so a fresh machine (no
            # ~/.ray/auth_token) starts it and an old token file is never read
            "RAY_AUTH_TOKEN": secrets.token_hex(16),
        }
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address, self.tmp, self.node2 = f"127.0.0.1:{port}", tmp, None
        head = _ray("start", "--head", "--port", str(port), "--include-dashboard=false", *NODE, env=self.env,
                    capture_output=True, text=True)  # fmt: skip
        if head.returncode:  # Ray's own last lines say why (a traceback's last line is its error)
            raise RuntimeError(f"ray start --head failed: {head.stderr.strip()[-600:]}")
        self.add_node()

    def add_node(self) -> None:
        """The second node: `ray start --block` in its own session, which its raylet and workers keep."""
        log = open(self.tmp / "node2.log", "a")
        self.node2 = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", self.address, "--block", *NODE],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.wait_nodes(2)

    def alive(self) -> int:
        out = _ray("status", "--address", self.address, env=self.env, capture_output=True, text=True).stdout
        active = out.split("Active:", 1)[-1].split("Pending:", 1)[0]
        return sum(1 for line in active.splitlines() if "node_" in line)

    def wait_nodes(self, n: int, timeout: float = 60) -> None:
        end = time.time() + timeout
        while self.alive() != n:
            assert time.time() < end, f"the cluster did not reach {n} nodes"
            time.sleep(1)

    def on_node2(self, pid: int) -> bool:
        """Whether ``pid`` belongs to the second node: Ray's workers lead their own process groups but stay in
        the session of the `ray start` that began their raylet."""
        try:
            return os.getsid(pid) == self.node2.pid
        except (ProcessLookupError, PermissionError):
            return False

    def kill_node2(self) -> None:
        """SIGKILL to every process of the second node (`ray start`, raylet, agents, workers), as a lost machine."""
        for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
            if self.on_node2(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.node2.wait(30)

    def stop(self) -> None:
        if self.node2 and self.node2.poll() is None:
            self.kill_node2()
        _ray("stop", "--force", env=self.env, capture_output=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("ray"))
    try:
        yield c
    finally:
        c.stop()


SWEEP = ["sweep", "micro", "k=1,2,3", "grpo.eval_every=0", "--quiet"]


def wb(tmp: Path, args: list[str], env: dict, log: str):
    return start_wb(tmp, args, log, {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db"})


def point_runs(tmp: Path, name: str):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    exp = client.get_experiment_by_name("workbench-micro")
    runs = client.search_runs([exp.experiment_id], f"tags.`workbench.sweep` = '{name}'") if exp else []
    return [r for r in runs if r.data.tags.get("workbench.sweep.role") == "point"]


def table(text: str) -> list[str]:
    """The results table's drafter / k / status columns (metrics and timings differ between runs)."""
    rows = [line.split() for line in text.splitlines() if line.startswith(("none ", "draft_model "))]
    return sorted(f"{r[0]} {r[1]} {r[-1]}" for r in rows)


@pytest.mark.slow
@requires("ray", "ray")
def test_sweep_spreads_over_both_nodes_and_tabulates_as_one_process(cluster, tmp_path):
    text = finish(wb(tmp_path, [*SWEEP, "grpo.steps=2", "--name", "spread", "--ray", cluster.address], cluster.env,
                     "ray.log"), tmp_path, "ray.log")  # fmt: skip
    runs = point_runs(tmp_path, "spread")
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 4, [r.info for r in runs]  # each point once
    assert len({r.data.tags[TAG_POINT] for r in runs}) == 4
    assert len({r.data.tags[TAG_NODE] for r in runs}) == 2, "the points ran on one node only"
    # the table and the resolved specs are those of the sweep run here (its plan: the same point keys)
    expected = ["draft_model 1 ok", "draft_model 2 ok", "draft_model 3 ok", "none - ok"]
    assert table(text) == expected, text
    plan = plan_sweep(SWEEP[1], [*SWEEP[2:4], "grpo.steps=2"])
    assert sorted(r.data.tags[TAG_POINT] for r in runs) == sorted(p.key for p in plan.points)
    again = finish(wb(tmp_path, [*SWEEP, "grpo.steps=2", "--name", "spread", "--ray", cluster.address], cluster.env,
                      "again.log"), tmp_path, "again.log")  # fmt: skip
    assert (
        again.count("skipped (finished in run") == 4 and len(point_runs(tmp_path, "spread")) == 4
    )  # resume: nothing reruns


@pytest.mark.slow
@requires("ray", "ray")
def test_a_node_killed_mid_point_has_it_rerun_on_the_other(cluster, tmp_path):
    if cluster.node2.poll() is not None:
        cluster.add_node()
    proc = wb(tmp_path, [*SWEEP, "grpo.steps=8", "--name", "kill", "--ray", cluster.address], cluster.env, "kill.log")
    victim, end = None, time.time() + 240
    while victim is None:  # a point RUNNING in a worker of node 2 (its process group)
        assert time.time() < end and proc.poll() is None, (tmp_path / "kill.log").read_text()[-3000:]
        time.sleep(1)
        opened = "sent to Ray" in (tmp_path / "kill.log").read_text()  # the store's schema is made by then
        for r in point_runs(tmp_path, "kill") if opened else []:
            if r.info.status == "RUNNING" and cluster.on_node2(int(r.data.tags.get(TAG_PID, "0"))):
                victim = r
    cluster.kill_node2()
    finish(proc, tmp_path, "kill.log")
    runs = point_runs(tmp_path, "kill")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    assert sorted(r.data.tags[TAG_POINT] for r in finished) == sorted({r.data.tags[TAG_POINT] for r in runs})
    assert len(finished) == 4, [r.info for r in runs]  # every point once: none lost, none twice
    dead = next(r for r in runs if r.info.run_id == victim.info.run_id)
    assert dead.info.status == "FAILED" and TAG_STALE in dead.data.tags, dead
    rerun = next(r for r in finished if r.data.tags[TAG_POINT] == victim.data.tags[TAG_POINT])
    assert rerun.data.tags[TAG_NODE] != victim.data.tags[TAG_NODE]  # the head ran it again
    assert rerun.data.tags["workbench.ray.attempt"] == "1"


def test_trials_in_flight_fill_the_cluster():
    from workbench.tune.ray_trials import slots

    assert slots({"CPU": 8.0}, {"num_cpus": 2.0, "num_gpus": 0.0}) == 4
    assert slots({"CPU": 1.0}, {"num_cpus": 2.0, "num_gpus": 0.0}) == 1  # never none
    assert slots({"CPU": 64.0, "GPU": 8.0}, {"num_cpus": 1.0, "num_gpus": 1.0}) == 8


def test_a_task_gets_absolute_stores(tmp_path):
    from workbench.tune import plan_tune
    from workbench.tune.ray_trials import task_plan

    spec = tmp_path / "s.yaml"
    raw = {**load_spec("micro").model_dump(mode="json", exclude={"tune"})}
    raw["tune"] = {"params": {"drafter.k": {"type": "int", "low": 1, "high": 2}}, "storage": "sqlite:///o.db"}
    import yaml

    spec.write_text(yaml.safe_dump(raw))
    sent = task_plan(plan_tune(str(spec), []), "sqlite:///mlflow.db", "/w")
    assert sent.storage == "sqlite:////w/o.db"
    assert sent.trial_spec({"drafter.k": 2}).tracking.tracking_uri == "sqlite:////w/mlflow.db"


@pytest.mark.slow
@requires("ray", "ray")
def test_tune_trials_run_as_ray_tasks_on_both_nodes(cluster, tmp_path):
    import optuna
    import yaml

    if cluster.node2.poll() is not None:
        cluster.add_node()
    raw = yaml.safe_load((ROOT / "experiments" / "micro.yaml").read_text())
    raw["grpo"]["eval_every"] = 0
    raw["tune"] = {"params": {"drafter.k": {"type": "int", "low": 1, "high": 3}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    args = ["tune", "s.yaml", "--trials", "4", "--study", "rt", "--quiet", "--ray", cluster.address]
    out = finish(wb(tmp_path, args, cluster.env, "tune.log"), tmp_path, "tune.log")
    study = optuna.load_study(study_name="rt", storage=f"sqlite:///{tmp_path}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4, out[-3000:]
    assert len({t.user_attrs["ray_node"] for t in study.trials}) == 2, "the trials ran on one node only"
    assert "2 at once" in out and "best trial" in out


@requires("ray", "ray")
def test_wb_sweep_on_an_unreachable_cluster_is_one_line_before_any_run(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening
        proc = wb(tmp_path, ["sweep", "micro", "k=1", "--ray", f"127.0.0.1:{port}", "--quiet"], {}, "bad.log")
        text = finish(proc, tmp_path, "bad.log", timeout=120, ok=False)
    assert proc.returncode == 2, text
    assert "no Ray cluster answers" in text and "Traceback" not in text
    assert "sweep micro" not in text  # refused before the parent run opened
