"""A real `mlflow server` on loopback: a micro sweep logged over HTTP lands as parent/child runs with metrics."""

import json
import urllib.request

import pytest
from typer.testing import CliRunner

from workbench.cli import app

from conftest import mlflow_server_with_sweep

pytestmark = pytest.mark.slow  # a server start and a sweep over HTTP
runner = CliRunner()

SWEEP = [
    "sweep",
    "micro",
    "drafter=ngram",
    "k=2",
    "grpo.steps=2",
    "grpo.eval_every=0",
    "rollout.max_new_tokens=16",
    "grpo.group_size=2",
    "--name",
    "http-sweep",
    "--quiet",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(base URL, tmp dir): mlflow server on sqlite in a tmp dir, a micro sweep logged to it over HTTP."""
    for base, _port, tmp in mlflow_server_with_sweep(tmp_path_factory, "mlflow-server", SWEEP):
        yield base, tmp


def api(base: str, path: str, body: dict | None = None, **query) -> dict:
    url = f"{base}/api/2.0/mlflow/{path}"
    if query:
        url += "?" + "&".join(f"{k}={urllib.request.quote(str(v))}" for k, v in query.items())
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_sweep_runs_and_metrics_are_served(server):
    base, _ = server
    exp = api(base, "experiments/get-by-name", experiment_name="workbench-micro")["experiment"]
    runs = api(
        base,
        "runs/search",
        {
            "experiment_ids": [exp["experiment_id"]],
            "filter": "tags.`workbench.sweep` = 'http-sweep'",
            "max_results": 100,
        },
    )["runs"]
    tags = [{t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs]
    parents = [r for r, t in zip(runs, tags) if t.get("workbench.sweep.role") == "parent"]
    assert len(parents) == 1 and parents[0]["info"]["status"] == "FINISHED"
    pid = parents[0]["info"]["run_id"]
    kids = [r for r, t in zip(runs, tags) if t.get("mlflow.parentRunId") == pid]
    assert len(kids) == 2 and all(k["info"]["status"] == "FINISHED" for k in kids)
    for k in kids:
        rid = k["info"]["run_id"]
        params = {p["key"]: p["value"] for p in k["data"]["params"]}
        hist = api(base, "metrics/get-history", run_id=rid, metric_key="timing_s/gen")["metrics"]
        assert sorted(m["step"] for m in hist) == [1, 2] and all(m["value"] > 0 for m in hist)
        latest = {m["key"]: m["value"] for m in k["data"]["metrics"]}
        assert "reward/mean" in latest
        if params["drafter.kind"] == "ngram":  # paired speedup: speculative points only (the baseline has none)
            assert latest["speedup/gen"] > 0 and latest["speedup/gen_n"] >= 1 and latest["speedup/gen_per_step"] > 0
            # the shown value: the run's estimate
            assert latest["speedup/gen"] == pytest.approx(latest["speedup/gen_mean"])
            assert params["drafter.k"] == "2" and "spec/acceptance_length" in latest
            acc = api(base, "metrics/get-history", run_id=rid, metric_key="spec/acceptance_length")["metrics"]
            assert len(acc) == 2 and all(m["value"] >= 1.0 for m in acc)
    arts = api(base, "artifacts/list", run_id=pid)
    assert "results.json" in {f["path"] for f in arts.get("files", [])}


def test_report_and_ui_url_read_the_server(server):
    base, tmp = server
    res = runner.invoke(app, ["report", "http-sweep", "--tracking-uri", base, "--out", str(tmp / "rep")])
    assert res.exit_code == 0, res.output
    assert "| ngram |" in (tmp / "rep" / "report.md").read_text()
    res = runner.invoke(app, ["ui", "--print-url", "--backend-store-uri", base, "--sweep", "http-sweep"])
    assert res.exit_code == 0 and "compare-runs?runs=[" in res.output, res.output
