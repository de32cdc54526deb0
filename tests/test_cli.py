"""End to end through the CLI on the micro spec: a real GRPO run logged to a real MLflow store."""

import pytest
from typer.testing import CliRunner

from workbench.cli import app
from workbench.experiment import run_experiment
from workbench.specs import load_spec

runner = CliRunner()

STEP_METRICS = [
    "timing_s/data",
    "timing_s/prepare",
    "timing_s/gen",
    "timing_s/logprob",
    "timing_s/train",
    "timing_s/step",
    "timing_s/other",
    "timing_frac/gen",
    "gen/tokens_per_s",
    "reward/mean",
    "reward/std",
    "frac_reward_zero_std",
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "loss/policy",
    "kl",
    "grad_norm",
    "eval/accuracy",
    "gen/logprob_abs_diff",
    "gen/logprob_truncation_abs_diff",
]
SPEC_METRICS = ["spec/acceptance_length", "spec/acceptance_rate", "spec/acceptance_rate_pos_0", "spec/num_drafts"]


def _only_run(client, experiment="workbench-micro"):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    assert len(runs) == 1
    return runs[0]


def test_wb_run_micro_logs_every_metric(store):
    res = runner.invoke(app, ["run", "micro", "--quiet"])
    assert res.exit_code == 0, res.output
    run = _only_run(store)
    assert run.info.status == "FINISHED"
    for key in STEP_METRICS + SPEC_METRICS:
        assert key in run.data.metrics, key
    assert run.data.metrics["spec/acceptance_length"] >= 1.0
    assert run.data.params["drafter.kind"] == "draft_model" and run.data.params["drafter.k"] == "3"
    hist = store.get_metric_history(run.info.run_id, "timing_s/gen")
    assert [m.step for m in hist] == [1, 2]
    arts = {a.path for a in store.list_artifacts(run.info.run_id)}
    assert "spec.yaml" in arts and "samples" in arts and "completions" in arts


@pytest.mark.parametrize("kind", ["none", "ngram"])
def test_wb_run_other_drafters(store, kind):
    res = runner.invoke(app, ["run", "micro", f"drafter.kind={kind}", "drafter.k=5", "grpo.steps=1", "--quiet"])
    assert res.exit_code == 0, res.output
    run = _only_run(store)
    assert run.info.status == "FINISHED"
    assert ("spec/acceptance_length" in run.data.metrics) == (kind != "none")


@pytest.mark.parametrize("override,needle", [("drafter.k=abc", "drafter.k"), ("drafter.kind=foo", "allowed values")])
def test_wb_run_bad_override_fails_clearly(store, override, needle):
    res = runner.invoke(app, ["run", override])
    assert res.exit_code == 2
    assert needle in res.output


def test_dry_run_prints_resolved_spec(store):
    res = runner.invoke(app, ["run", "--dry-run", "drafter.k=6"])
    assert res.exit_code == 0 and "k: 6" in res.output


def test_crash_marks_run_failed_and_keeps_metrics(store, monkeypatch):
    from workbench.grpo import trainer as trainer_mod

    real_step = trainer_mod.GRPOTrainer.step

    def flaky(self, step, on_stage=None):
        if step == 2:
            raise RuntimeError("boom")
        return real_step(self, step, on_stage)

    monkeypatch.setattr(trainer_mod.GRPOTrainer, "step", flaky)
    with pytest.raises(RuntimeError, match="boom"):
        run_experiment(load_spec("micro", ["grpo.eval_every=0"]), progress=False)
    run = _only_run(store)
    assert run.info.status == "FAILED"
    assert [m.step for m in store.get_metric_history(run.info.run_id, "timing_s/gen")] == [1]


def test_corrupt_task_file_is_a_clear_error(store, tmp_path):
    bad = tmp_path / "data.jsonl"
    bad.write_text('{"prompt": "x", "answer": "1"}\n{not json\n')
    res = runner.invoke(app, ["run", "micro", f"task.path={bad}", "--quiet"])
    assert res.exit_code == 2
    assert "task.path" in res.output
