"""`wb tune`: search-space parsing and checks, objectives, pruning, an Optuna study via the CLI, resume."""

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from workbench.cli import app
from workbench.experiment import EarlyStop, RunResult
from workbench.spec import CategoricalParam, FloatParam, IntParam, SpecError, load_spec, validate_spec
from workbench.tracking import Tracker
from workbench.tune import TrialPrunedStop, objective_value, plan_tune, pruning_hook

runner = CliRunner()
MICRO = yaml.safe_load(open(__file__.rsplit("/tests/", 1)[0] + "/experiments/micro.yaml"))
SPACE = {"drafter.kind": {"type": "categorical", "choices": ["ngram", "draft_model"]}, "drafter.k": {"type": "int", "low": 1, "high": 4}}


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def write_spec(path, params=SPACE, **tune):
    raw = {**MICRO, "grpo": {**MICRO["grpo"], "eval_every": 0}, "tune": {"params": params, "storage": f"sqlite:///{path.parent}/optuna.db", **tune}}
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _runs(client, study, experiment="workbench-micro"):
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], f"tags.`workbench.study` = '{study}'")
    by_role = {}
    for r in runs:
        by_role.setdefault(r.data.tags["workbench.tune.role"], []).append(r)
    return by_role


# ----------------------------------------------------------------------------- search space


def test_search_space_types_parse():
    t = validate_spec({"tune": {"params": {
        "drafter.kind": {"type": "categorical", "choices": ["ngram", "none"]},
        "drafter.k": {"type": "int", "low": 1, "high": 7, "step": 2},
        "grpo.lr": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
    }}}).tune
    p = t.params
    assert isinstance(p["drafter.kind"], CategoricalParam) and p["drafter.kind"].choices == ["ngram", "none"]
    assert isinstance(p["drafter.k"], IntParam) and (p["drafter.k"].low, p["drafter.k"].high, p["drafter.k"].step) == (1, 7, 2)
    assert isinstance(p["grpo.lr"], FloatParam) and p["grpo.lr"].log
    assert (t.objective, t.sampler, t.pruner, t.storage, t.direction) == ("speedup_gen", "tpe", "median", "sqlite:///optuna.db", "maximize")


def test_default_tune_section_is_not_dumped():
    s = load_spec("micro")
    assert "tune" not in s.to_yaml() and not any(k.startswith("tune.") for k in s.flat_params())


@pytest.mark.parametrize("space,needles", [
    ({"type": "range", "low": 1}, ["tune.params.drafter.k", "'categorical', 'int', 'float'"]),
    ({"type": "int", "low": 5, "high": 2}, ["tune.params.drafter.k", "low (5) must be <= high (2)"]),
    ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, ["log: true needs low > 0"]),
    ({"type": "int", "low": 1, "high": 2, "lo": 3}, ["tune.params.drafter.k", "unknown key"]),
    ({"type": "categorical", "choices": []}, ["tune.params.drafter.k", "choices"]),
])
def test_bad_search_space(space, needles):
    with pytest.raises(SpecError) as e:
        validate_spec({"tune": {"params": {"drafter.k": space}}})
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_grid_needs_discrete_params():
    with pytest.raises(SpecError, match="sampler grid needs categorical or int"):
        validate_spec({"tune": {"sampler": "grid", "params": {"grpo.lr": {"type": "float", "low": 0.1, "high": 0.2}}}})


@pytest.mark.parametrize("params,needles", [
    ({"drafter.kx": {"type": "int", "low": 1, "high": 3}}, ["tune.params.drafter.kx", "not a dotted spec key", "Did you mean 'drafter.k'"]),
    ({"drafter.k": {"type": "int", "low": 1, "high": 20}}, ["tune.params.drafter.k: value 20", "drafter.k", "narrow"]),
    ({"drafter.kind": {"type": "categorical", "choices": ["ngram", "eagle9"]}}, ["tune.params.drafter.kind: value 'eagle9'", "allowed values"]),
    ({"tracking.experiment": {"type": "categorical", "choices": ["a"]}}, ["tune.params.tracking.experiment", "cannot be tuned"]),
    ({}, ["no search space"]),
])
def test_plan_checks_keys_and_values(workdir, params, needles):
    with pytest.raises(SpecError) as e:
        plan_tune(write_spec(workdir / "s.yaml", params=params))
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_plan_defaults_and_trial_spec(workdir):
    plan = plan_tune(write_spec(workdir / "s.yaml"), ["grpo.steps=3"])
    assert plan.name == "micro-tune" and "tune" not in plan.raw
    s = plan.trial_spec({"drafter.kind": "ngram", "drafter.k": 4})
    assert (s.drafter.kind, s.drafter.k, s.grpo.steps, s.tune.params) == ("ngram", 4, 3, {})
    assert plan_tune(None).tune.params  # experiments/tune.yaml has a search space


# ----------------------------------------------------------------------------- objective / pruning


def test_objective_value():
    hist = [{"timing_s/gen": 9.0, "timing_s/step": 10.0, "gen/tokens_per_s": 1.0},
            {"timing_s/gen": 1.0, "timing_s/step": 2.0, "gen/tokens_per_s": 100.0},
            {"timing_s/gen": 3.0, "timing_s/step": 4.0, "gen/tokens_per_s": 200.0}]
    base = {"timing_s/gen": 4.0, "timing_s/step": 6.0}
    assert objective_value("gen_tokens_per_s", hist) == 150.0  # step 1 = warm-up, skipped
    assert objective_value("speedup_gen", hist, base) == 2.0
    assert objective_value("speedup_step", hist, base) == 2.0
    assert objective_value("speedup_gen", hist[:1], base) == pytest.approx(4 / 9)  # one step: nothing skipped
    assert objective_value("speedup_gen", hist, None) is None
    with pytest.raises(ValueError, match="unknown objective"):
        objective_value("loss", hist)


class FakeTrial:
    def __init__(self, prune_at):
        self.prune_at, self.reported = prune_at, []

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return len(self.reported) >= self.prune_at


def test_pruning_hook_reports_running_value_and_raises_pruned():
    trial = FakeTrial(prune_at=2)
    hook = pruning_hook(trial, "speedup_gen", {"timing_s/gen": 2.0})
    hook(1, {"timing_s/gen": 4.0})
    with pytest.raises(TrialPrunedStop) as e:
        hook(2, {"timing_s/gen": 1.0})
    assert trial.reported == [(1, 0.5), (2, 2.0)]
    assert isinstance(e.value, optuna.TrialPruned) and isinstance(e.value, EarlyStop)
    assert e.value.tags == {"workbench.pruned": "true"} and e.value.step == 2


# ----------------------------------------------------------------------------- studies (fake runs, real Optuna + MLflow)


def fake_runner(calls, slow_after=None):
    """run_experiment stand-in: real MLflow runs, no training; gen time 1/(1+k), baseline 1 s.

    ``slow_after``: trial runs after this many get 10x slower (to be pruned). Emulates EarlyStop like run_experiment.
    """

    def fake_run(spec, console=None, progress=True, parent_run_id=None, tags=None, summary=True, on_step=None):
        calls.append(spec)
        t = spec.tracking
        gen = 1.0 if spec.drafter.kind == "none" else 1.0 / (1 + spec.drafter.k)
        if slow_after is not None and spec.drafter.kind != "none" and sum(c.drafter.kind != "none" for c in calls) > slow_after:
            gen *= 10
        hist = []
        with Tracker(t.tracking_uri, t.experiment, run_name=t.run_name, tags=tags, parent_run_id=parent_run_id) as tr:
            tr.log_params(spec.flat_params())
            for step in range(1, spec.grpo.steps + 1):
                m = {"timing_s/gen": gen + (5.0 if step == 1 else 0.0), "timing_s/step": 2 * gen, "gen/tokens_per_s": 10 / gen, "reward/mean": 0.5}
                tr.log_metrics(m, step=step)
                hist.append(m)
                if on_step:
                    try:
                        on_step(step, m)
                    except EarlyStop as e:
                        e.run_id = tr.run_id
                        tr.set_tags({"workbench.stopped_early": "true", **e.tags})
                        tr.end("FINISHED")
                        raise
        return RunResult(tr.run_id, tr.tracking_uri, hist)

    return fake_run


def test_cli_study_writes_best_spec_and_resumes_without_baseline(workdir, monkeypatch):
    import workbench.experiment as experiment

    calls = []
    monkeypatch.setattr(experiment, "run_experiment", fake_runner(calls))
    spec = write_spec(workdir / "s.yaml")
    res = runner.invoke(app, ["tune", spec, "--trials", "3", "--study", "st", "--quiet"])
    assert res.exit_code == 0, res.output
    assert [c.drafter.kind for c in calls].count("none") == 1 and len(calls) == 4
    out = workdir / "best-st.yaml"
    assert out.is_file() and "best trial" in res.output and "wb run" in res.output
    best = load_spec(str(out))
    study = optuna.load_study(study_name="st", storage=f"sqlite:///{workdir}/optuna.db")
    assert best.drafter.k == study.best_trial.params["drafter.k"] and best.drafter.kind == study.best_trial.params["drafter.kind"]
    assert best.tune.params == {} and "tune" not in out.read_text().split("\n", 3)[3]
    assert study.best_value == pytest.approx(1 + best.drafter.k)  # speedup_gen = 1 s / (1/(1+k)) s
    attrs = [k for k in study.user_attrs if k.startswith("baseline/")]
    assert len(attrs) == 1 and study.user_attrs[attrs[0]]["timing_s/gen"] == 1.0 and study.user_attrs["objective"] == "speedup_gen"

    client = MlflowClient(f"sqlite:///{workdir}/mlflow.db")
    roles = _runs(client, "st")
    assert len(roles["parent"]) == 1 and len(roles["baseline"]) == 1 and len(roles["trial"]) == 3
    parent = roles["parent"][0]
    assert parent.info.status == "FINISHED" and "results.json" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    for r in roles["trial"]:
        assert r.data.tags["mlflow.parentRunId"] == parent.info.run_id and r.info.status == "FINISHED"
        k = int(r.data.tags["workbench.param.drafter.k"])
        assert r.data.metrics["tune/objective"] == pytest.approx(1 + k) and "workbench.tune.trial" in r.data.tags

    again = runner.invoke(app, ["tune", spec, "--trials", "5", "--study", "st", "--quiet"])
    assert again.exit_code == 0, again.output
    assert "3 trials done, 2 to run" in again.output
    assert [c.drafter.kind for c in calls].count("none") == 1 and len(calls) == 6  # no baseline rerun
    assert len(optuna.load_study(study_name="st", storage=f"sqlite:///{workdir}/optuna.db").trials) == 5
    roles = _runs(client, "st")
    assert len(roles["parent"]) == 1 and len(roles["trial"]) == 5

    same = runner.invoke(app, ["tune", spec, "--trials", "5", "--study", "st", "--quiet"])
    assert same.exit_code == 0 and "0 to run" in same.output and len(calls) == 6

    other = runner.invoke(app, ["tune", spec, "tune.objective=speedup_step", "--trials", "6", "--study", "st", "--quiet"])
    assert other.exit_code == 2 and "optimizes speedup_gen" in other.output


def test_median_pruner_prunes_slow_trial(workdir, monkeypatch):
    import workbench.experiment as experiment

    calls = []
    monkeypatch.setattr(experiment, "run_experiment", fake_runner(calls, slow_after=1))
    spec = write_spec(workdir / "s.yaml", params={"drafter.k": {"type": "categorical", "choices": [3]}}, startup_trials=1,
                      objective="gen_tokens_per_s")
    res = runner.invoke(app, ["tune", spec, "grpo.steps=3", "--trials", "2", "--study", "pr", "--quiet", "--out", "sub/b.yaml"])
    assert res.exit_code == 0, res.output
    study = optuna.load_study(study_name="pr", storage=f"sqlite:///{workdir}/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"] and study.trials[1].last_step == 2
    assert "pruned at step 2" in res.output and (workdir / "sub/b.yaml").is_file()
    assert not [c for c in calls if c.drafter.kind == "none"]  # gen_tokens_per_s needs no baseline
    roles = _runs(MlflowClient(f"sqlite:///{workdir}/mlflow.db"), "pr")
    pruned = [r for r in roles["trial"] if r.data.tags.get("workbench.pruned") == "true"]
    assert len(pruned) == 1 and pruned[0].info.status == "FINISHED" and "tune/objective" in pruned[0].data.metrics


def test_cli_bad_spec_exits_2(workdir):
    res = runner.invoke(app, ["tune", write_spec(workdir / "s.yaml", params={"drafter.kx": {"type": "int", "low": 1, "high": 2}})])
    assert res.exit_code == 2 and "tune.params.drafter.kx" in res.output


# ----------------------------------------------------------------------------- real runs (micro models)


def test_real_run_experiment_early_stop_ends_finished(workdir):
    from workbench.experiment import run_experiment

    spec = load_spec("micro", ["grpo.eval_every=0", "grpo.steps=2"])

    def stop(step, metrics):
        raise EarlyStop(tags={"workbench.pruned": "true"})

    with pytest.raises(EarlyStop) as e:
        run_experiment(spec, progress=False, on_step=stop)
    run = MlflowClient(f"sqlite:///{workdir}/mlflow.db").get_run(e.value.run_id)
    assert run.info.status == "FINISHED" and len(e.value.history) == 1
    assert run.data.tags["workbench.pruned"] == "true" and run.data.tags["workbench.stopped_at_step"] == "1"


def test_real_micro_study_best_yaml_loads(workdir):
    spec = write_spec(workdir / "s.yaml", params={"drafter.k": {"type": "int", "low": 1, "high": 2}}, objective="gen_tokens_per_s")
    res = runner.invoke(app, ["tune", spec, "--trials", "2", "--study", "real", "--quiet"])
    assert res.exit_code == 0, res.output
    best = load_spec(str(workdir / "best-real.yaml"))
    assert best.drafter.k in (1, 2) and best.model.target == "micro"
