"""The scripts under examples/ run as a user runs them (``python examples/X.py``), in a tiny setting."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.extras import requires

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run(tmp_path: Path, script: str, *args: str) -> str:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlflow.db"}
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


@pytest.mark.slow
def test_own_checkpoint_dataset_and_reward(tmp_path):
    out = _run(tmp_path, "own_model_data_reward.py", "--steps", "1")
    assert (tmp_path / "example-own" / "checkpoint" / "config.json").is_file()
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("example-own").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_id in out
    assert run.data.params["task.reward"] and run.data.params["drafter.kind"] == "ngram"
    assert "reward/exact_number" in run.data.metrics and "reward/brevity" in run.data.metrics
    mean = run.data.metrics["reward/exact_number"] + 0.1 * run.data.metrics["reward/brevity"]
    assert run.data.metrics["reward/mean"] == pytest.approx(mean, abs=1e-6)


@pytest.mark.slow
def test_sweep_results_read_into_a_dataframe(tmp_path):
    out = _run(tmp_path, "sweep_to_pandas.py", "--steps", "2")
    lines = out.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["drafter", "k"])
    rows = [line.split() for line in lines[header + 1 :]]
    assert [r[1] for r in rows] == ["ngram", "ngram", "none"] and [r[2] for r in rows[:2]] == ["1", "2"]
    assert all(r[-1] == "FINISHED" for r in rows) and float(rows[0][3]) > 0


@requires("trl", "trl")
@pytest.mark.slow
def test_trl_grpo_trainer_through_the_workbench(tmp_path):
    out = _run(tmp_path, "trl_grpo.py", "--steps", "2")
    last = out.strip().splitlines()[-1]
    assert "spec/acceptance_length" in last and "rewards/exact_number/mean" in last
